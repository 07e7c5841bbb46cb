"""A decode and the block log it writes tell one story: the same TPFs, the verification the
decoder used (with no false alarm on its own rule), and whole-block scores that tie exactly
when the two blocks are the same and equal an independent from-scratch scoring otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from brisk.mechanism import analyze, read_blocks
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.isd import DecodeResult, ISDOptions, decode
from brisk.runtime.isd.blocklog import BlockLogger
from tests.runtime.test_isd import MASK, V, micro_backbone, random_corrector

EOS = 9  # a token the micro model often drafts, so blocks reach EOS


@pytest.fixture(scope="module")
def backbone() -> HFBackbone:
    return micro_backbone(sharpen=4.0)  # flat enough for rejections, EOS now and then


def prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (n,), generator=g).tolist()
    return [torch.randint(1, MASK, (k,), generator=g).tolist() for k in lengths]


def run_logged(
    backbone: HFBackbone,
    path: Path,
    options: ISDOptions,
    corrector: Corrector | None = None,
    n: int = 24,
    batch_size: int = 5,
) -> DecodeResult:
    K = corrector.config.K if corrector is not None else options.top_k
    with BlockLogger(path, options.M, K) as logger:
        return decode(
            backbone,
            prompts(n, 0),
            options,
            corrector=corrector,
            logger=logger,
            batch_size=batch_size,
            seeds=range(100, 100 + n),
        )


CASES = [
    pytest.param(0.0, None, 5, id="greedy-head-off"),
    pytest.param(1.0, None, 5, id="T1-head-off"),
    pytest.param(1.0, "on", 1, id="T1-head-on-lone-rows"),
    pytest.param(0.0, "on", 3, id="greedy-head-on"),
    pytest.param(1.0, "shadow", 4, id="T1-shadow"),
]


@pytest.mark.parametrize(("T", "head", "batch"), CASES)
@pytest.mark.parametrize("budget", [1, 5, 40], ids=["budget1", "budget5", "budget40"])
def test_report_of_the_log_has_the_decodes_tpfs(
    backbone: HFBackbone, tmp_path: Path, T: float, head: str | None, batch: int, budget: int
) -> None:
    """Whole-run and complete-cycle counts equal the decoder's exactly, and the renewal
    interval is the same numbers; budget 1 makes requests that end at their opening cold start
    (no block at all), budget 5 cuts rounds, 40 lets EOS end most requests."""
    options = ISDOptions(
        stride=4,
        temperature=T,
        max_new_tokens=budget,
        eos_token_id=EOS,
        top_k=4,
        shadow=head == "shadow",
    )
    corrector = random_corrector(3, K=4) if head else None
    out = run_logged(backbone, tmp_path / "log", options, corrector, batch_size=batch)
    decoded = out.run_tpf()
    if budget == 1:
        assert out.forwards == len(out.requests)  # one cold start each, nothing logged
        assert not any((tmp_path / "log").glob("part-*.parquet"))
        return
    report = analyze(tmp_path / "log", draws=20)
    assert report.run is not None
    assert report.unlisted_requests == 0
    logged = report.run
    assert (logged.requests, logged.output_tokens, logged.forwards) == (
        decoded.requests,
        decoded.output_tokens,
        decoded.forwards,
    )
    assert (logged.cycle_tokens, logged.cycle_forwards) == (
        decoded.cycle_tokens,
        decoded.cycle_forwards,
    )
    assert logged.cycle_profile == decoded.cycle_profile
    assert logged.renewal == decoded.renewal
    assert logged.whole_run == out.tpf
    assert logged.complete_cycles == out.cycle_tpf
    assert report.replay.contradictions == 0  # the decoder's own rule reproduces accept_len
    drafted_by_head = head == "on"
    assert report.replay.unchecked_blocks == (report.n_blocks if drafted_by_head and T else 0)
    assert report.verification.rule == ("greedy" if T == 0 else "sampled")


def test_a_log_that_lost_request_rows_reports_them(backbone: HFBackbone, tmp_path: Path) -> None:
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=20, eos_token_id=EOS, top_k=4)
    out = run_logged(backbone, tmp_path / "log", options)
    for f in (tmp_path / "log").glob("requests-*.parquet"):
        f.unlink()
    report = analyze(tmp_path / "log", draws=20)
    assert report.run is None  # no TPF it cannot stand behind
    assert report.profile == out.profile()


def test_a_non_intervening_head_ties_every_block(backbone: HFBackbone, tmp_path: Path) -> None:
    """A fresh head (zero residual) chooses what the base chooses: in shadow mode with block
    scoring every pair is tied, bitwise, and mean ΔL is exactly 0, EOS blocks included."""
    options = ISDOptions(
        stride=4,
        temperature=1.0,
        max_new_tokens=40,
        eos_token_id=EOS,
        top_k=4,
        shadow=True,
        score_blocks=True,
    )
    head = Corrector(CorrectorConfig.small(32, V, M=3, K=4))
    out = run_logged(backbone, tmp_path / "log", options, head, n=30, batch_size=4)
    columns = ("base_choice", "head_choice", "head_block", "base_logp", "head_logp", "cand_ids")
    rows = [b for b in read_blocks(tmp_path / "log", columns=columns)]
    base = np.concatenate([b["base_choice"] for b in rows])
    assert np.array_equal(base, np.concatenate([b["head_choice"] for b in rows]))
    assert np.array_equal(base, np.concatenate([b["head_block"] for b in rows]))
    eos_blocks = sum(int((b["cand_ids"] == EOS).any(-1).any(-1).sum()) for b in rows)
    assert eos_blocks > 0  # blocks around EOS are in the test
    report = analyze(tmp_path / "log", draws=20)
    lk = report.likelihood
    assert lk.pairs == report.n_blocks == sum(len(r.accept_lengths) for r in out.requests)
    assert lk.mean_delta.pooled == 0.0
    assert lk.mean_delta.equal_request == 0.0
    assert (lk.tied.pooled, lk.positive.pooled, lk.negative.pooled) == (1.0, 0.0, 0.0)


def through_eos(block: list[int]) -> list[int]:
    return block[: block.index(EOS) + 1] if EOS in block else block


@torch.no_grad()
def scratch_logp(backbone: HFBackbone, prefix: list[int], block: list[int]) -> float:
    """L(b | c) by one plain causal forward over c + b, cut after the block's first EOS."""
    ids = torch.tensor([prefix + block])
    logp = torch.log_softmax(backbone.model(input_ids=ids).logits[0].double(), -1)
    start = len(prefix) - 1
    end = block.index(EOS) + 1 if EOS in block else len(block)
    return sum(float(logp[start + i, block[i]]) for i in range(end))


@pytest.mark.parametrize("shadow", [True, False], ids=["shadow", "head-on"])
def test_block_scores_match_an_independent_scoring(
    backbone: HFBackbone, tmp_path: Path, shadow: bool
) -> None:
    """An intervening head: every logged L(b | c) equals a from-scratch forward over the
    request's own prefix and the block (float32 model: 1e-4 nats), and a pair is tied exactly
    when its blocks agree up to and including their EOS."""
    options = ISDOptions(
        stride=4,
        temperature=1.0,
        max_new_tokens=30,
        eos_token_id=EOS,
        top_k=4,
        shadow=shadow,
        score_blocks=True,
    )
    head = random_corrector(3, K=4)
    n = 16
    out = run_logged(backbone, tmp_path / "log", options, head, n=n, batch_size=3)
    plain = decode(
        backbone,
        prompts(n, 0),
        dataclasses.replace(options, score_blocks=False),
        corrector=head,
        batch_size=3,
        seeds=range(100, 100 + n),
    )
    assert out.tokens == plain.tokens  # the scoring forwards change nothing, lone rows included
    sequences = [p + o for p, o in zip(prompts(n, 0), out.tokens, strict=True)]
    differ = tied = with_eos = 0
    for batch in read_blocks(tmp_path / "log"):
        for r in range(len(batch)):
            cand, offset = batch["cand_ids"][r], int(batch["token_offset"][r])
            prefix = sequences[int(batch["request_id"][r])][:offset]
            pick = np.arange(3)
            base = cand[pick, batch["base_choice"][r]].tolist()
            own = cand[pick, batch["head_block"][r]].tolist()
            for block, column in ((base, "base_logp"), (own, "head_logp")):
                want = scratch_logp(backbone, prefix, block)
                assert batch[column][r] == pytest.approx(want, abs=1e-4)
            same = through_eos(base) == through_eos(own)
            assert (batch["head_logp"][r] == batch["base_logp"][r]) == same
            differ += not same
            tied += same
            with_eos += EOS in base or EOS in own
    assert min(differ, tied, with_eos) > 5, (differ, tied, with_eos)
