"""ISD end to end: exact sampling, greedy parity, theory ties, batch independence, logging.

The model is a randomly initialized Qwen3 with a 12-token vocabulary (id 11 is MASK) whose LM
head is scaled up so next-token laws are peaked and context dependent. The exact law of the
first M + 2 generated tokens, the shortest output in which every draft position 1..M of the
first block decides a token, is enumerated from plain autoregressive forwards of the clean
stream (V^(M+1) contexts), so ISD samples can be tested against it directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM

from brisk.mechanism import validate
from brisk.mechanism.report import analyze
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.isd import DecodeResult, ISDOptions, RequestOutput, decode
from brisk.runtime.isd import batched as isd_step
from brisk.runtime.isd.blocklog import BlockLogger

V, MASK = 12, 11
PROMPTS = ([1, 2, 3], [4, 5, 6, 7, 8])
N_PER_PROMPT = 16_000  # 32,000 samples per case
MIN_REACH = 400  # times every draft position decides an output token, per prompt and case


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
def exact_law(backbone: HFBackbone, prompt: list[int], n: int) -> np.ndarray:
    """J[y_1, …, y_n] = Π_t p(y_t | prompt, y_<t) ``[V**n]`` (C order), by enumerating the
    V^(n−1) contexts."""
    base = torch.tensor(prompt)
    law, contexts = torch.ones(1, dtype=torch.float64), torch.zeros(1, 0, dtype=torch.long)
    for t in range(n):
        ids = torch.cat([base.expand(len(contexts), -1), contexts], 1)
        p = torch.softmax(backbone.model(input_ids=ids).logits[:, -1].double(), -1)  # [V^t, V]
        law = (law[:, None] * p).reshape(-1)
        if t < n - 1:
            every = torch.arange(V).repeat(len(contexts))[:, None]
            contexts = torch.cat([contexts.repeat_interleave(V, 0), every], 1)
    return law.numpy()


@pytest.fixture(scope="module")
def exact(backbone: HFBackbone) -> Callable[[list[int], int], np.ndarray]:
    """:func:`exact_law` of the module's backbone, each (prompt, n) enumerated once."""
    laws: dict[tuple[tuple[int, ...], int], np.ndarray] = {}

    def law(prompt: list[int], n: int) -> np.ndarray:
        if (key := (tuple(prompt), n)) not in laws:
            laws[key] = exact_law(backbone, prompt, n)
        return laws[key]

    return law


def chi_square(counts: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson statistic with the cells of expected count < 5 pooled into one."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum() - 1)


@dataclass(frozen=True)
class Exactness:
    """The outputs of one prompt against their exact law: Pearson χ² and total variation.

    χ² does not reject at 1e-3 when its survival function stays above it; TV stays below
    ``tv_bound`` = τ + t, where τ = ½Σ sqrt(J(1−J)/n) bounds E[TV] (Jensen per cell) and
    t = sqrt(ln(1e6)/2n) is the McDiarmid deviation that TV (1/n-Lipschitz in each sample)
    exceeds with probability ≤ 1e-6."""

    statistic: float
    dof: int
    tv: float
    tv_bound: float

    @classmethod
    def of(cls, out: DecodeResult, law: np.ndarray) -> Exactness:
        samples = np.array(out.tokens)
        n, length = samples.shape
        assert law.size == V**length, "every output has the law's length"
        counts = np.bincount(np.ravel_multi_index(samples.T, (V,) * length), minlength=law.size)
        statistic, dof = chi_square(counts.astype(float), n * law)
        tv = 0.5 * np.abs(counts / n - law).sum()
        tau = 0.5 * np.sqrt(law * (1 - law) / n).sum()
        return cls(statistic, dof, float(tv), float(tau + math.sqrt(math.log(1e6) / (2 * n))))


def output_length(stride: int) -> int:
    """M + 2 tokens: the prefill commits token 1, a cold start token 2 and the first block's
    drafts x_1..x_M land on tokens 3..M + 2, so every draft position 1..M decides an output
    token (3 tokens reach position 1 only)."""
    return stride + 1


@pytest.mark.parametrize(
    ("stride", "head_kind"),
    [
        pytest.param(3, "off", id="N3-head-off"),
        pytest.param(4, "random", id="N4-random-head"),
        pytest.param(4, "trained", id="N4-trained-head"),
    ],
)
def test_sampling_matches_autoregressive_law(
    backbone: HFBackbone,
    exact: Callable[[list[int], int], np.ndarray],
    stride: int,
    head_kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """Outputs of M + 2 tokens follow the exact autoregressive law (:class:`Exactness`: χ²
    over both prompts does not reject at 1e-3, TV below its bound per prompt), and every draft
    position 1..M decided an output token at least ``MIN_REACH`` times per prompt. The trained
    head is the one distilled from this backbone's verifier (conftest ``micro_head``): its law
    π is far from q."""
    head = {
        "off": lambda: None,
        "random": lambda: random_corrector(stride - 1, K=4),
        "trained": lambda: request.getfixturevalue("micro_head")[1],
    }[head_kind]()
    length = output_length(stride)
    options = ISDOptions(stride=stride, temperature=1.0, max_new_tokens=length)
    statistic, dof = 0.0, 0
    for k, prompt in enumerate(PROMPTS):
        seeds = range(k * N_PER_PROMPT, (k + 1) * N_PER_PROMPT)
        out = decode(
            backbone,
            [prompt] * N_PER_PROMPT,
            options,
            corrector=head,
            seeds=seeds,
            batch_size=N_PER_PROMPT,
        )
        assert out.lengths == [length] * N_PER_PROMPT
        reached = out.output_profile().reached
        assert len(reached) == stride - 1
        assert min(reached) >= MIN_REACH, (prompt, reached)
        check = Exactness.of(out, exact(prompt, length))
        statistic, dof = statistic + check.statistic, dof + check.dof
        assert check.tv < check.tv_bound, (prompt, check)
        if head is not None:  # the head really changed the proposals
            assert out.profile().n_blocks > 0
    assert stats.chi2.sf(statistic, dof) > 1e-3, (statistic, dof)


def test_the_exactness_check_catches_the_argmax_shortcut(
    backbone: HFBackbone,
    exact: Callable[[list[int], int], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control: drafting the argmax but verifying as if it were drawn from q (the
    I-DLM fork's sampling shortcut) must fail the same checks. At N = 2 the M + 2 = 3 tokens
    reach the one draft position and the law has V³ cells; at N ≥ 3 the extra output tokens
    widen the TV bound about as much as the shortcut moves TV."""
    original = isd_step.propose

    def argmax_drafts(*args: object, **kwargs: object) -> isd_step.Draft:
        draft = original(*args, **kwargs)  # type: ignore[arg-type]
        return replace(draft, ranks=torch.zeros_like(draft.ranks), tokens=draft.cand_ids[..., 0])

    monkeypatch.setattr(isd_step, "propose", argmax_drafts)
    n, prompt, length = 10_000, PROMPTS[0], output_length(2)
    options = ISDOptions(stride=2, temperature=1.0, max_new_tokens=length)
    check = Exactness.of(
        decode(backbone, [prompt] * n, options, seeds=range(n), batch_size=n), exact(prompt, length)
    )
    assert stats.chi2.sf(check.statistic, check.dof) < 1e-6, check
    assert check.tv > check.tv_bound, check


def test_the_exactness_check_catches_a_verifier_that_accepts_past_position_one(
    backbone: HFBackbone,
    exact: Callable[[list[int], int], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: the verifier accepts draft positions ≥ 2 whatever p says (their uniforms set
    to 0, so x_i is accepted iff p_i(x_i) > 0). On the outputs of the N3-head-off case the same
    checks must reject: χ² at 1e-6 and TV above its bound. The 3-token outputs the χ² tests
    used to decode cannot see it: their tokens are the real verifier's, one for one."""
    original = isd_step.verify_block

    def accept_past_one(
        logits: torch.Tensor,
        draft: isd_step.Draft,
        temperature: float,
        u_accept: torch.Tensor,
        u_next: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        u_accept = u_accept.clone()
        u_accept[:, 1:] = 0.0
        return original(logits, draft, temperature, u_accept, u_next)

    prompt, length = PROMPTS[0], output_length(3)
    short = ISDOptions(stride=3, temperature=1.0, max_new_tokens=3)
    real = decode(backbone, [prompt] * 2000, short, seeds=range(2000), batch_size=2000).tokens
    monkeypatch.setattr(isd_step, "verify_block", accept_past_one)
    mutated = decode(backbone, [prompt] * 2000, short, seeds=range(2000), batch_size=2000)
    assert mutated.tokens == real
    assert mutated.output_profile().reached.tolist() == [2000, 0]

    n = 10_000
    options = ISDOptions(stride=3, temperature=1.0, max_new_tokens=length)
    out = decode(backbone, [prompt] * n, options, seeds=range(n), batch_size=n)
    assert out.output_profile().reached[1] >= MIN_REACH
    check = Exactness.of(out, exact(prompt, length))
    assert stats.chi2.sf(check.statistic, check.dof) < 1e-6, check
    assert check.tv > check.tv_bound, check


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


def test_each_request_stops_at_its_own_budget(backbone: HFBackbone) -> None:
    """Per-request budgets: each request's output is what it gives decoded alone with that
    budget as ``max_new_tokens`` (same tokens and forwards), whatever the others' budgets."""
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [2, 2]]
    budgets = [3, 13, 1, 8]
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=13)
    together = decode(backbone, prompts, options, budgets=budgets, batch_size=3).requests
    for r, (prompt, budget) in enumerate(zip(prompts, budgets, strict=True)):
        alone = decode(
            backbone, [prompt], replace(options, max_new_tokens=budget), seeds=[r], request_ids=[r]
        ).requests[0]
        assert together[r].tokens == alone.tokens
        assert len(together[r].tokens) == budget
        assert together[r].finished == "length"
        assert together[r].forwards == alone.forwards
    for bad, match in (([3, 14, 1, 8], "request 1's must be"), ([3, 13], "one per prompt")):
        with pytest.raises(ValueError, match=match):
            decode(backbone, prompts, options, budgets=bad)
    with pytest.raises(ValueError, match=r"^budgets: prompt 2 \(6 tokens\) \+ 250 new tokens"):
        decode(backbone, prompts, replace(options, max_new_tokens=256), budgets=[1, 1, 250, 1])
    # fit_positions lowers a budget to what fits the 256 positions after its prompt
    long = [5, 6, 7, 8, 9, 10] * 34  # 204 tokens: 46 new tokens fit with 2M = 6
    fitted = decode(
        backbone, [[1, 2], long], replace(options, max_new_tokens=60), fit_positions=True
    )
    assert [len(r.tokens) for r in fitted.requests] == [60, 256 - 204 - 6]
    alone = decode(
        backbone, [long], replace(options, max_new_tokens=46), seeds=[1], request_ids=[1]
    )
    assert fitted.requests[1].tokens == alone.tokens[0]


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
