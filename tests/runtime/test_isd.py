"""ISD end to end: exact sampling, greedy parity, theory ties, batch independence, logging.

The model is a randomly initialized Qwen3 with a 12-token vocabulary (id 11 is MASK) whose LM
head is scaled up so next-token laws are peaked and context dependent. The exact law of the
first three generated tokens is enumerated from plain autoregressive forwards of the clean
stream (V² contexts), so ISD samples can be tested against it directly.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from brisk.mechanism.io import validate
from brisk.mechanism.report import analyze
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.blocklog import BlockLogger
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.isd import DecodeResult, ISDOptions, RequestOutput, decode
from brisk.runtime.isd import batched as isd_step

V, MASK = 12, 11
PROMPTS = ([1, 2, 3], [4, 5, 6, 7, 8])
N_PER_PROMPT = 30_000  # 60,000 samples per case


def micro_backbone(seed: int = 0, sharpen: float = 25.0) -> HFBackbone:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return HFBackbone(model, mask_token_id=MASK)


@pytest.fixture(scope="module")
def backbone() -> HFBackbone:
    return micro_backbone()


def random_corrector(M: int, K: int) -> Corrector:
    torch.manual_seed(5)
    head = Corrector(CorrectorConfig.small(32, V, M=M, K=K))
    for p in head.parameters():
        nn.init.normal_(p, std=0.3)
    return head


@torch.no_grad()
def exact_first_three(backbone: HFBackbone, prompt: list[int]) -> np.ndarray:
    """J[a, b, c] = p(a | prompt) p(b | prompt a) p(c | prompt a b), by enumeration."""
    model = backbone.model

    def next_law(contexts: torch.Tensor) -> torch.Tensor:
        return torch.softmax(model(input_ids=contexts).logits[:, -1].double(), -1)

    base = torch.tensor(prompt)
    p1 = next_law(base[None])[0]  # [V]
    ctx2 = torch.cat([base.expand(V, -1), torch.arange(V)[:, None]], 1)
    p2 = next_law(ctx2)  # [V, V]
    pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    ctx3 = torch.cat([base.expand(V * V, -1), pairs], 1)
    p3 = next_law(ctx3).reshape(V, V, V)
    return (p1[:, None, None] * p2[:, :, None] * p3).numpy()


def chi_square(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson statistic with the cells of expected count < 5 pooled into one."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum() - 1)


@pytest.mark.parametrize(
    ("stride", "head_kind"),
    [
        pytest.param(3, "off", id="N3-head-off"),
        pytest.param(4, "random", id="N4-random-head"),
        pytest.param(4, "trained", id="N4-trained-head"),
    ],
)
def test_sampling_matches_autoregressive_law(
    backbone: HFBackbone, stride: int, head_kind: str, request: pytest.FixtureRequest
) -> None:
    """Chi-square does not reject at 1e-3, and TV stays below τ + t where τ = ½Σ sqrt(J(1−J)/n)
    bounds E[TV] (Jensen per cell) and t = sqrt(ln(1e6)/2n) is the McDiarmid deviation that TV
    (1/n-Lipschitz in each sample) exceeds with probability ≤ 1e-6. The trained head is the one
    distilled from this backbone's verifier (conftest ``micro_head``): its law π is far from q."""
    head = {
        "off": lambda: None,
        "random": lambda: random_corrector(stride - 1, K=4),
        "trained": lambda: request.getfixturevalue("micro_head")[1],
    }[head_kind]()
    with_head = head is not None
    options = ISDOptions(stride=stride, temperature=1.0, max_new_tokens=3)
    statistic, dof = 0.0, 0
    for k, prompt in enumerate(PROMPTS):
        seeds = range(k * N_PER_PROMPT, (k + 1) * N_PER_PROMPT)
        out = decode(
            backbone, [prompt] * N_PER_PROMPT, options, corrector=head, seeds=seeds,
            batch_size=N_PER_PROMPT,
        )  # fmt: skip
        samples = np.array(out.tokens)
        assert samples.shape == (N_PER_PROMPT, 3)
        counts = np.bincount(np.ravel_multi_index(samples.T, (V, V, V)), minlength=V**3)
        law = exact_first_three(backbone, prompt).ravel()
        s, d = chi_square(counts.astype(float), N_PER_PROMPT * law)
        statistic, dof = statistic + s, dof + d
        tv = 0.5 * np.abs(counts / N_PER_PROMPT - law).sum()
        tau = 0.5 * np.sqrt(law * (1 - law) / N_PER_PROMPT).sum()
        assert tv < tau + math.sqrt(math.log(1e6) / (2 * N_PER_PROMPT)), (prompt, tv, tau)
        if with_head:  # the head really changed the proposals
            assert out.profile().n_blocks > 0
    assert stats.chi2.sf(statistic, dof) > 1e-3, (statistic, dof)


def test_the_exactness_check_catches_the_argmax_shortcut(
    backbone: HFBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: drafting the argmax but verifying as if it were drawn from q (the
    I-DLM fork's sampling shortcut) must fail the same checks."""
    original = isd_step.propose

    def argmax_drafts(*args: object, **kwargs: object) -> isd_step.Draft:
        draft = original(*args, **kwargs)  # type: ignore[arg-type]
        return replace(draft, ranks=torch.zeros_like(draft.ranks), tokens=draft.cand_ids[..., 0])

    monkeypatch.setattr(isd_step, "propose", argmax_drafts)
    n, prompt = 10_000, PROMPTS[0]
    options = ISDOptions(stride=3, temperature=1.0, max_new_tokens=3)
    samples = np.array(decode(backbone, [prompt] * n, options, seeds=range(n), batch_size=n).tokens)
    counts = np.bincount(np.ravel_multi_index(samples.T, (V, V, V)), minlength=V**3)
    law = exact_first_three(backbone, prompt).ravel()
    statistic, dof = chi_square(counts.astype(float), n * law)
    assert stats.chi2.sf(statistic, dof) < 1e-6
    tv = 0.5 * np.abs(counts / n - law).sum()
    assert tv > 0.5 * np.sqrt(law * (1 - law) / n).sum() + math.sqrt(math.log(1e6) / (2 * n))


@torch.no_grad()
def ar_greedy(backbone: HFBackbone, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Plain greedy decoding of the clean stream, full forward per step (no cache, no ISD)."""
    out: list[list[int]] = [[] for _ in prompts]
    for length in {len(p) for p in prompts}:
        rows = [i for i, p in enumerate(prompts) if len(p) == length]
        seq = torch.tensor([prompts[i] for i in rows])
        for _ in range(n):
            nxt = backbone.model(input_ids=seq).logits[:, -1].argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
        for i, row in zip(rows, seq[:, length:].tolist(), strict=True):
            out[i] = row
    return out


@pytest.mark.parametrize("stride", [2, 4, 8], ids=["N2", "N4", "N8"])
def test_greedy_isd_equals_greedy_autoregressive(backbone: HFBackbone, stride: int) -> None:
    g = torch.Generator().manual_seed(stride)
    prompts = [
        torch.randint(0, MASK, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(100)
    ]
    out = decode(backbone, prompts, ISDOptions(stride=stride, max_new_tokens=16))
    assert out.tokens == ar_greedy(backbone, prompts, 16)


@pytest.mark.parametrize("head_kind", ["random", "trained"])
def test_head_on_greedy_is_still_greedy_decoding(
    backbone: HFBackbone, head_kind: str, request: pytest.FixtureRequest
) -> None:
    prompts = [[1, 2], [3], [4, 4, 4, 9], [7, 0, 10, 2, 5]]
    head = (
        random_corrector(3, K=4)
        if head_kind == "random"
        else request.getfixturevalue("micro_head")[1]
    )
    out = decode(backbone, prompts, ISDOptions(stride=4, max_new_tokens=12), corrector=head)
    assert out.tokens == ar_greedy(backbone, prompts, 12)
    assert out.profile().n_blocks > 0


def test_outputs_do_not_depend_on_the_batch(backbone: HFBackbone) -> None:
    """A request's uniforms are keyed by its (seed, request id): together, alone and reordered
    give the same tokens."""
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [2, 2]]
    seeds, ids = [10, 11, 12, 13], [7, 8, 9, 10]
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=10)
    together = decode(backbone, prompts, options, seeds=seeds, request_ids=ids).tokens
    alone = [
        decode(backbone, [p], options, seeds=[s], request_ids=[r]).tokens[0]
        for p, s, r in zip(prompts, seeds, ids, strict=True)
    ]
    reordered = decode(
        backbone, prompts[::-1], options, seeds=seeds[::-1], request_ids=ids[::-1], batch_size=3
    ).tokens[::-1]
    assert together == alone == reordered
    other_ids = decode(backbone, prompts, options, seeds=seeds).tokens
    assert other_ids != together  # the request id is part of the key


def test_stops_at_eos_and_budget(backbone: HFBackbone) -> None:
    prompt = [1, 2, 3]
    free = decode(backbone, [prompt], ISDOptions(stride=4, max_new_tokens=12)).tokens[0]
    eos = free[4]
    out = decode(backbone, [prompt], ISDOptions(stride=4, max_new_tokens=12, eos_token_id=eos))
    assert out.tokens[0] == free[: free.index(eos) + 1]
    assert out.requests[0].finished == "eos"
    assert (
        decode(backbone, [prompt], ISDOptions(stride=4, max_new_tokens=5)).requests[0].finished
        == "length"
    )


def test_forward_counts_equal_with_and_without_head(backbone: HFBackbone) -> None:
    """The head adds no backbone forward: with the same accept lengths, same forwards."""
    prompts = [[1, 2, 3], [7, 8]]
    options = ISDOptions(stride=4, max_new_tokens=14)
    off = decode(backbone, prompts, options)
    on = decode(
        backbone, prompts, options, corrector=Corrector(CorrectorConfig.small(32, V, 3, K=4))
    )
    for a, b in zip(off.requests, on.requests, strict=True):
        assert a.accept_lengths == b.accept_lengths  # an untrained head keeps the base ranking
        assert a.forwards == b.forwards


@pytest.mark.parametrize("stride", [4, 8], ids=["N4", "N8"])
def test_measured_tpf_matches_theory(backbone: HFBackbone, stride: int) -> None:
    """Over complete renewal cycles the measured TPF is the ISD TPF of the measured profile
    (an identity of eq:nonuniform_tpf once the runtime commits g_L tokens in c_L forwards); over
    the whole run it differs only by each request's start-up forward and unfinished last cycle."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, MASK, (3,), generator=g).tolist() for _ in range(40)]
    head = random_corrector(stride - 1, K=4)
    options = ISDOptions(stride=stride, temperature=1.0, max_new_tokens=60)
    out = decode(backbone, prompts, options, corrector=head)
    rounds = sum(len(r.accept_lengths) for r in out.requests)
    assert rounds > 500
    assert 0.1 < out.profile().rates()[0] < 0.99  # a non-trivial profile
    assert out.cycle_tpf == pytest.approx(out.cycle_renewal_tpf(), rel=1e-12)
    # Each request adds at most a start-up cold start (1 token, 1 forward) and an unfinished
    # cycle (≤ M tokens, 1 forward) to the complete cycles: |Δtokens − TPF·Δforwards| ≤
    # max(M + 1, 2·TPF) per request, so the whole-run TPF is within that, over all forwards.
    predicted = out.cycle_renewal_tpf()
    edge = len(prompts) * max(stride, 2 * predicted) / out.forwards
    assert abs(out.tpf - predicted) <= edge


@pytest.mark.parametrize("stride", [4, 8], ids=["N4", "N8"])
def test_a_profile_from_one_run_predicts_another_runs_tpf(stride: int) -> None:
    """Finite-horizon renewal: the acceptance profile of run A and the output lengths of run B
    predict B's whole-run TPF (different prompts, seeds and request ids) within the 99 %
    predictive interval, while the complete-cycle TPF of A, which leaves out cold starts and
    unfinished last cycles, lies far outside it (outputs of ~10 tokens make that gap wide).

    A flatter micro model (LM head ×2) accepts most proposals: complete-cycle TPF ≈ 3.2 at
    N = 4 and ≈ 4.8 at N = 8 against whole-run TPF ≈ 2.3 and ≈ 2.8. Seeds are fixed; the
    interval's level bounds how often a fresh seed would fail (1 %)."""
    backbone = micro_backbone(sharpen=2.0)
    g = torch.Generator().manual_seed(1)
    options = ISDOptions(stride=stride, temperature=1.0, max_new_tokens=24, eos_token_id=0)

    def run(n: int, offset: int) -> DecodeResult:
        prompts = [torch.randint(1, MASK, (3,), generator=g).tolist() for _ in range(n)]
        seeds = list(range(offset, offset + n))
        return decode(backbone, prompts, options, seeds=seeds, request_ids=seeds)

    a, b = run(60, 0), run(40, 1000)
    assert len(set(b.lengths)) > 3  # EOS and the budget give a spread of lengths
    # every verify round reaches slot 1 inside the output; only later slots can be censored
    assert a.output_profile().reached[0] == a.profile().reached[0]
    prediction = b.predicted_run_tpf(a.output_profile(), level=0.99, seed=0)
    assert prediction.low <= b.tpf <= prediction.high, (prediction, b.tpf)
    assert a.cycle_tpf > prediction.high + 0.5, (prediction, a.cycle_tpf)


@pytest.mark.parametrize("shadow", [True, False], ids=["head-shadow", "head-on"])
def test_block_log_validates_and_reports(
    backbone: HFBackbone, tmp_path: Path, shadow: bool
) -> None:
    head = random_corrector(3, K=4)
    log = tmp_path / "blocks"
    prompts = [[1, 2, 3], [4, 5], [9]]
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=30, shadow=shadow)
    scored = ISDOptions(**{**options.__dict__, "score_blocks": True})
    with BlockLogger(log, M=3, K=4) as logger:
        out = decode(backbone, prompts, scored, corrector=head, logger=logger)
    plain = decode(backbone, prompts, options, corrector=head)
    assert out.tokens == plain.tokens  # the diagnostic forwards change nothing
    assert out.forwards == plain.forwards  # and are not counted
    rounds = sum(len(r.accept_lengths) for r in out.requests)
    assert validate(log) == rounds
    report = analyze([log], ks=(2, 4), draws=50)
    assert report.profile == out.profile()
    assert report.n_blocks == rounds
    assert report.likelihood.pairs == rounds
    assert np.isfinite(report.likelihood.mean_delta.equal_request)


def test_output_profile_leaves_out_slots_past_the_response_end() -> None:
    """n = 4, M = 3: the prefill commits token 1, a cold start token 2, then a verify round
    with L = 2 commits tokens 3..5, of which only 3..4 are output. Slot 3's rejection lies past
    the end: the all-round profile counts it, the output profile does not."""
    out = RequestOutput(tokens=[5, 6, 7, 0], forwards=3, committed=5, accept_lengths=[2])
    assert out.profile(3).reached.tolist() == [1, 1, 1]
    assert out.profile(3).accepted.tolist() == [1, 1, 0]
    assert out.output_profile(3).reached.tolist() == [1, 1, 0]
    assert out.output_profile(3).accepted.tolist() == [1, 1, 0]
    # a rejection inside the output counts: n = 6, prefill and cold start (tokens 1, 2),
    # rounds L = 1 (reject slot 2), then cold start, then L = 3 with one output token left
    # (slots 2 and 3 are past the end)
    out = RequestOutput(tokens=[1, 2, 3, 4, 5, 0], forwards=5, accept_lengths=[1, 3])
    assert out.output_profile(3).reached.tolist() == [2, 1, 0]
    assert out.output_profile(3).accepted.tolist() == [2, 0, 0]
