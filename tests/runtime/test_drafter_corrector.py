"""The corrector on a drafter's drafts: events from the speculative loop, a head trained on them,
and the head drafting in brisk's loop.

- Events: one row per verify round of :func:`speculative_decode` (the rounds the loop ran), each
  row's candidates the Top-K of the target's LM head over the drafter's MASK-slot hidden states
  it stores (DFlash's draft logits), its anchor hidden state zero (what SGLang's DFlash sampler
  gives the head), its verifier targets those of the block log.
- Training: ``train_corrector`` on such a store lowers the held-out loss below the untrained
  (identity) head's.
- Head on, greedy: the output is the target's greedy decoding token for token, and the drafts
  are the head's (they differ from the drafter's argmax somewhere).
- Head on, T = 1: the first three output tokens of n = 800 requests against the target's
  exact law of three tokens, Pearson's χ² (cells with expected count < 5 pooled, 60 cells):
  p > 0.001, fixed seeds. Negative control: the head's drafts verified as if drawn from the
  drafter's own Top-K law (the law the head replaced) must fail with p < 1e-6.

  Power (n = 800, 59 degrees of freedom): the negative control's law is Cohen's w ≈ 0.50 from
  the target's (measured on 2,000 draws, sampling bias removed), a noncentrality n·w² ≈ 200
  against the critical χ² of 126 at α = 1e-6: it passes with probability 1e-7 (observed
  p = 6e-22; at n = 500 the power was 0.99 and p = 5e-8, too close). The exact-law test at
  α = 1e-3 detects w = 0.33 with power 0.99. n = 2,000 took 2.5× as long.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import brisk.runtime.isd.batched as batched
from brisk.cli import main
from brisk.runtime.backbone import ModelHeads
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.drafter import SDOptions, speculative_decode
from brisk.runtime.isd.blocklog import BlockLogger
from brisk.runtime.train.corrector.config import CorrectorTrainConfig
from brisk.runtime.train.corrector.events import collect_draft_events
from brisk.runtime.train.corrector.recipe import train_corrector
from tests.runtime.test_drafter import (
    PROMPT,
    V,
    chi2_pvalue,
    exact_law,
    greedy_reference,
    tiny_drafter,
    tiny_target,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [[0, 1, 2, 3], [0, 4], [5, 5, 1, 0, 2, 2, 3], [1], [2, 3, 4], [4, 4, 0]]


def random_head(M: int, K: int, vocab: int, seed: int = 5, std: float = 0.3) -> Corrector:
    """A head whose every weight is random (its residual gate open): it reranks."""
    torch.manual_seed(seed)
    head = Corrector(CorrectorConfig.small(32, vocab, M=M, K=K))
    for p in head.parameters():
        nn.init.normal_(p, std=std)
    return head.eval()


def test_the_loops_events_are_its_rounds_with_the_drafters_candidates(tmp_path: Path) -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    options = SDOptions(temperature=1.0, draft="top-k", top_k=4, max_new_tokens=24)
    store = collect_draft_events(
        target, drafter, PROMPTS, options, tmp_path / "events", batch_size=4
    )
    free = speculative_decode(target, drafter, PROMPTS, options)  # the same seeds and ids
    assert len(store) == sum(len(o.accept_lengths) for o in free.outputs)
    assert store.accept_len.tolist() == [L for o in free.outputs for L in o.accept_lengths]
    assert (store.M, store.K, store.hidden_size, store.vocab_size) == (3, 4, 32, 6)
    assert store.meta["decoder"]["algorithm"] == "speculative"
    assert store.meta["stride"] == 4
    assert not np.asarray(store.anchor_hidden).any()  # as SGLang's DFlash sampler sees it
    mask_hidden = torch.from_numpy(np.asarray(store.mask_hidden))
    with torch.no_grad():
        values, ids = target.lm_head(mask_hidden).topk(4, dim=-1)
    assert torch.equal(ids, torch.from_numpy(store.cand_ids))
    assert torch.allclose(values, torch.from_numpy(np.asarray(store.cand_logits)), atol=1e-5)
    # the drafts were drawn at T = 1 from q restricted to the Top-K: every rank occurs
    assert len(np.unique(store.base_choice)) > 1


def test_a_head_trained_on_the_loops_events_beats_the_untrained_head(tmp_path: Path) -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    options = SDOptions(temperature=1.0, draft="top-k", top_k=4, max_new_tokens=32)
    prompts = [[i % 6, (3 * i) % 6, (i + 2) % 6] for i in range(48)]
    store = collect_draft_events(target, drafter, prompts, options, tmp_path / "ev")
    cfg = CorrectorTrainConfig(
        events=str(tmp_path / "ev"),
        out_dir=str(tmp_path / "head"),
        head="small",
        K=4,
        epochs=6,
        batch_size=32,
        lr=3e-3,
        only_correct=False,
    )
    heads = ModelHeads(target)
    result = train_corrector(cfg, show_progress=False, backbone=heads, store=store)  # type: ignore[arg-type]
    assert result.outcome.val_loss < result.outcome.val_loss_init - 0.01
    head = Corrector.from_pretrained(result.checkpoint)
    assert (head.config.M, head.config.K) == (3, 4)
    # the head drafts in the loop, exactly: greedy output is the target's greedy decoding
    out = speculative_decode(
        target, drafter, PROMPTS[:2], SDOptions(max_new_tokens=30), corrector=head
    ).outputs
    for prompt, o in zip(PROMPTS[:2], out, strict=True):
        assert o.tokens == greedy_reference(target, prompt, 30)


def test_greedy_head_drafts_keep_the_targets_greedy_decoding(tmp_path: Path) -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    head = random_head(3, 4, 6)
    options = SDOptions(max_new_tokens=40)
    path = tmp_path / "blocks"
    with BlockLogger(path, M=3, K=4, decoder="speculative") as logger:
        on = speculative_decode(target, drafter, PROMPTS, options, corrector=head, logger=logger)
    for prompt, o in zip(PROMPTS, on.outputs, strict=True):
        assert o.tokens == greedy_reference(target, prompt, 40)
    report = tmp_path / "report"
    assert main(["mechanism", "report", str(path), "--out", str(report), "--bootstrap", "20"]) == 0
    summary = json.loads((report / "summary.json").read_text())
    assert summary["verification"]["draft_law"] == "head"
    assert summary["corrector"]
    assert summary["verification"]["contradictions"] == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(path, columns=["head_choice"]).to_pydict()["head_choice"]
    assert any(any(r > 0 for r in row) for row in rows)  # the head chose off the drafter's argmax


@pytest.fixture(scope="module")
def head_world() -> tuple[object, object, Corrector, dict[tuple[int, ...], float]]:
    target = tiny_target(V, scale=3.0)
    return target, tiny_drafter(target, 3), random_head(2, 3, V, std=0.6), exact_law(target, PROMPT)


N = 800  # sized by the power calculation in the module docstring


def head_samples(world: tuple[object, object, Corrector, object]) -> list[tuple[int, ...]]:
    target, drafter, head, _ = world
    options = SDOptions(temperature=1.0, draft="top-k", top_k=3, max_new_tokens=3)
    result = speculative_decode(
        target,
        drafter,
        [PROMPT] * N,
        options,
        seeds=list(range(N)),
        corrector=head,  # type: ignore[arg-type]
    )
    assert result.mean_accept > 0.3  # drafts were accepted: verification did the work
    return [tuple(o.tokens) for o in result.outputs]


def test_sampled_head_drafts_follow_the_targets_law(
    head_world: tuple[object, object, Corrector, dict[tuple[int, ...], float]],
) -> None:
    assert chi2_pvalue(head_samples(head_world), head_world[3]) > 1e-3


def test_negative_control_head_drafts_verified_against_the_drafters_law_fail(
    head_world: tuple[object, object, Corrector, dict[tuple[int, ...], float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head draws its drafts; verification is told they came from q restricted to the
    Top-K (the law a head-off loop would hand over)."""
    propose = batched.propose

    def mislabelled(*args: object, **kwargs: object) -> batched.Draft:
        draft = propose(*args, **kwargs)  # type: ignore[arg-type]
        cand_logits = torch.gather(args[0], -1, draft.cand_ids)  # type: ignore[call-overload]
        return dataclasses.replace(draft, law=torch.softmax(cand_logits.double(), -1))

    monkeypatch.setattr("brisk.runtime.drafter.speculative.propose", mislabelled)
    assert chi2_pvalue(head_samples(head_world), head_world[3]) < 1e-6


def test_a_head_that_does_not_fit_the_pair_is_refused_in_one_line() -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    for head, options, message in (
        (random_head(2, 4, 6), SDOptions(), r"corrector: a head for M = 2 positions; the drafter"),
        (random_head(3, 4, 7), SDOptions(), r"corrector: a head for hidden 32 / vocab 7"),
        (
            random_head(3, 4, 6),
            SDOptions(temperature=1.0, draft="sample"),
            r"draft: with a head at T > 0 the drafts are the head's draws .* got 'sample'",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            speculative_decode(target, drafter, [[0]], options, corrector=head)


def test_brisk_train_corrector_collects_a_drafters_events_and_trains_on_them(
    micro_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command-line door: ``collect --drafter`` on the AR target's training problems (the
    stride defaults to the drafter's block), then ``brisk train corrector`` on the store; a
    drafter of another block than ``--stride`` and a prompt the target's positions cannot hold
    with the budget are refused in one line, before anything is written."""
    from brisk.runtime.drafter import DFlashDrafter, drafter_config, save_drafter
    from brisk.runtime.loader import load_target
    from brisk.runtime.train.corrector.store import EventStore

    target, _, mask = load_target(micro_base)
    torch.manual_seed(0)
    config = drafter_config(
        target.config, num_layers=1, block_size=4, mask_token_id=mask, target_layer_ids=[0]
    )
    save_drafter(DFlashDrafter(config), tmp_path / "drafter")
    collect = ["train", "corrector", "collect", "--checkpoint", str(micro_base)]
    flags = ["--drafter", str(tmp_path / "drafter"), "--problems", "10", "--samples", "1"]
    flags += ["--max-new-tokens", "16", "--top-k", "4", "--batch-size", "4", "--no-progress"]
    assert main([*collect, *flags, "--out", str(tmp_path / "ev")]) == 0
    assert "events from 10 responses" in capsys.readouterr().out
    store = EventStore.open(tmp_path / "ev")
    assert (store.M, store.K, store.meta["stride"]) == (3, 4, 4)
    assert store.meta["decoder"] == {"algorithm": "speculative", "head": "off"}
    assert store.meta["drafter"] == str(tmp_path / "drafter")
    train = ["train", "corrector", "--events", str(tmp_path / "ev"), "--out", str(tmp_path / "h")]
    train += ["--head", "small", "--K", "4", "--epochs", "1", "--no-only-correct"]
    assert main([*train, "--no-progress"]) == 0  # the store's target is loaded as its backbone
    head = Corrector.from_pretrained(tmp_path / "h" / "final")
    assert (head.config.M, head.config.K) == (3, 4)
    capsys.readouterr()
    assert main([*collect, *flags, "--stride", "6", "--out", str(tmp_path / "ev2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--stride: 6, but the drafter's block is 4 (pass --stride 4)")
    assert len(err.splitlines()) == 1
    long = ["--max-new-tokens", "100000", "--out", str(tmp_path / "ev3")]
    assert main([*collect, *flags, *long]) == 2
    err = capsys.readouterr().err.strip()
    assert "--task: problem 0's prompt is" in err
    assert "--max-new-tokens 100000 and a block of 4 it exceeds the target's 128" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "ev3").exists()
    assert not (tmp_path / ".ev3.partial").exists()
