"""Finite-horizon ISD: the exact DP for E[F(n)] against path enumeration, Monte Carlo of the
decoder's state machine (the prefill commits the first token and counts as a forward, then a
cold start), the renewal limit eq:idlm_tpf_instantiation and closed forms; and the predictive
interval of predict_run_tpf against simulated runs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    RunTPFPrediction,
    accept_length_pmf,
    expected_forwards,
    predict_run_tpf,
    run_tpf,
    simulate_run,
    tpf,
)
from brisk.theory.horizon import _cold_forwards
from tests.theory.strategies import profiles


def enumerate_expected_forwards(a: np.ndarray, n: int, *, prefill: bool = True) -> Fraction:
    """E[F(n)] by walking every path of the state machine, in exact arithmetic.

    Prefill (``prefill``): 1 forward, 1 token, then a cold start; without it the walk starts at
    a cold start (F_cold). Cold start: 1 forward, 1 token, then a verify round. Verify round:
    L = k with Pr(L = k), k + 1 tokens; warm again iff k = M. Stop once ≥ n tokens are
    committed (a response of 0 tokens costs nothing, not even the prefill).
    """
    M = a.size
    A = [Fraction(1)]
    for x in a:
        A.append(A[-1] * Fraction(float(x)))
    pmf = [A[k] * (1 - Fraction(float(a[k]))) for k in range(M)] + [A[M]]
    total = Fraction(0)

    def walk(tokens: int, verify: bool, prob: Fraction, forwards: int) -> None:
        nonlocal total
        if tokens >= n:
            total += prob * forwards
            return
        if not verify:
            walk(tokens + 1, True, prob, forwards + 1)
            return
        for k, p in enumerate(pmf):
            if p:
                walk(tokens + k + 1, k == M, prob * p, forwards + 1)

    if n == 0:
        return Fraction(0)
    if prefill:
        walk(1, False, Fraction(1), 1)
    else:
        walk(0, False, Fraction(1), 0)
    return total


@settings(max_examples=200)
@given(a=st.integers(1, 3).flatmap(profiles), n_max=st.integers(0, 10))
def test_dp_equals_path_enumeration(a: np.ndarray, n_max: int) -> None:
    dp = expected_forwards(a, n_max)
    assert dp.shape == (n_max + 1,)
    exact = [float(enumerate_expected_forwards(a, n)) for n in range(n_max + 1)]
    np.testing.assert_allclose(dp, exact, rtol=1e-12, atol=1e-12)


@settings(max_examples=100)
@given(a=st.integers(1, 3).flatmap(profiles), n_max=st.integers(1, 10))
def test_prefill_then_cold_start(a: np.ndarray, n_max: int) -> None:
    """F(n) = 1 + F_cold(n − 1): the prefill commits token 1, the cold-start machine the rest;
    both sides exact, F_cold by enumerating the walk that opens with a cold start."""
    cold = _cold_forwards(a, n_max - 1)
    exact_cold = [float(enumerate_expected_forwards(a, m, prefill=False)) for m in range(n_max)]
    np.testing.assert_allclose(cold, exact_cold, rtol=1e-12, atol=1e-12)
    forwards = expected_forwards(a, n_max)
    assert forwards[0] == 0
    assert forwards[1] == 1  # a response of one token is the prefill alone
    np.testing.assert_allclose(forwards[1:], 1 + cold, rtol=1e-15, atol=0)


def test_a_one_token_response_costs_the_prefill_alone() -> None:
    a = np.array([[0.9, 0.8, 0.7], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert (simulate_run(a, [1] * 50, seed=1).forwards == 1).all()
    np.testing.assert_array_equal(expected_forwards(a, 1), [[0, 1]] * 3)
    np.testing.assert_array_equal(run_tpf(a, [1, 1, 1]), [1.0] * 3)


RUNS = 4000
DELTA = 1e-6


def empirical_bernstein(x: np.ndarray, width: float) -> float:
    """Half-width of a two-sided 1 − 2·DELTA bound on |mean(x) − E[x]| for i.i.d. x in an
    interval of ``width`` (Maurer & Pontil 2009, Thm 4): sqrt(2 V ln(2/δ)/n) + 7 w ln(2/δ) /
    (3(n − 1)), V the sample variance. Unlike 5σ alone it holds when a rare outcome (an
    acceptance at a = 1e-8) never shows up in the sample and σ reads 0."""
    n, log = x.size, math.log(2 / DELTA)
    return math.sqrt(2 * x.var(ddof=1) * log / n) + 7 * width * log / (3 * (n - 1))


@settings(max_examples=200)
@given(a=profiles(), n=st.integers(1, 60))
def test_dp_equals_monte_carlo_within_bernstein_bound(a: np.ndarray, n: int) -> None:
    forwards = simulate_run(a, [n] * RUNS, seed=0).forwards
    assert forwards.shape == (RUNS,)
    # the prefill and a cold start commit 1 token each, a verify round ≤ M + 1
    fewest = 1 if n == 1 else 2 + math.ceil((n - 2) / (a.size + 1))
    assert forwards.min() >= fewest
    assert forwards.max() <= n  # every forward commits ≥ 1
    bound = empirical_bernstein(forwards.astype(float), n - fewest)
    assert abs(forwards.mean() - expected_forwards(a, n)[n]) <= bound + 1e-9


def test_batched_simulation_is_seeded_and_matches_the_dp() -> None:
    a = np.array([[0.9, 0.8, 0.7], [0.5, 0.95, 0.9]])
    lengths = np.array([3, 17, 40] * 2000)
    first = simulate_run(a, lengths, seed=7)
    np.testing.assert_array_equal(first.forwards, simulate_run(a, lengths, seed=7).forwards)
    assert first.forwards.shape == (2, lengths.size)
    for b in range(2):
        for n in (3, 17, 40):
            got = first.forwards[b, lengths == n]
            sigma = got.std(ddof=1) / math.sqrt(got.size)
            assert abs(got.mean() - expected_forwards(a[b], n)[n]) <= 5 * sigma
    np.testing.assert_allclose(first.tpf, lengths.sum() / first.forwards.sum(-1))


@settings(max_examples=200)
@given(a=profiles())
def test_wald_bounds_and_the_renewal_limit(a: np.ndarray) -> None:
    """1 + (n − 2)/TPF ≤ E[F(n)] ≤ 2 + (n + M − 2)/TPF (the prefill, then the cold-start
    machine's Wald bounds), so run TPF → TPF(a) at rate O(1/n)."""
    M, rate = a.size, float(tpf(a, CostModel.isd(a.size)))
    n = np.arange(501)
    forwards = expected_forwards(a, int(n[-1]))
    slack = 1e-9 * n
    assert (forwards[1:] >= 1 + (n[1:] - 2) / rate - slack[1:]).all()
    assert (forwards[1:] <= 2 + (n[1:] + M - 2) / rate + slack[1:]).all()
    cold = _cold_forwards(a, int(n[-1]))  # the cold-start machine's own bounds
    assert (cold[1:] >= (n[1:] - 1) / rate - slack[1:]).all()
    assert (cold[1:] <= 1 + (n[1:] + M - 1) / rate + slack[1:]).all()
    long = run_tpf(a, [n[-1]])
    assert abs(long - rate) <= (2 * rate + M - 2) / forwards[-1] + 1e-12


def test_run_tpf_approaches_the_renewal_tpf() -> None:
    a = np.array([0.9, 0.85, 0.8, 0.8, 0.75, 0.7, 0.7])
    lengths, rate, M = (10, 100, 1000, 10_000), float(tpf(a)), a.size
    gaps = [abs(run_tpf(a, [n]) - rate) for n in lengths]
    assert all(later < earlier / 5 for earlier, later in itertools.pairwise(gaps))
    forwards = expected_forwards(a, lengths[-1])
    for n, gap in zip(lengths, gaps, strict=True):  # the Wald bound of the module docstring
        assert gap <= (2 * rate + M - 2) / forwards[n]
    assert gaps[-1] < 1.5e-3  # O(1/n): about 14 / n here (the prefill and a cold start)


@pytest.mark.parametrize("M", [1, 2, 7, 15], ids=lambda M: f"M{M}")
def test_all_accepted_closed_form(M: int) -> None:
    """a = 1: the prefill (token 1), a cold start (token 2), then M + 1 tokens every forward:
    F(n) = 1 + F_cold(n − 1) with F_cold(m) = 1 + ⌈(m − 1)/(M + 1)⌉ (m ≥ 1), F_cold(0) = 0."""

    def closed(n: np.ndarray) -> np.ndarray:
        m = n - 1
        return 1 + np.where(m == 0, 0, 1 + np.ceil((m - 1) / (M + 1)))

    n = np.arange(1, 301)
    exact = closed(n)
    np.testing.assert_array_equal(exact[:2], [1, 2])
    np.testing.assert_array_equal(exact[2:], 2 + np.ceil((n[2:] - 2) / (M + 1)))
    forwards = expected_forwards(np.ones(M), 300)
    assert forwards[0] == 0
    np.testing.assert_array_equal(forwards[1:], exact)
    lengths = np.random.default_rng(M).integers(1, 300, size=50)
    expected = lengths.sum() / closed(lengths).sum()
    assert run_tpf(np.ones(M), lengths) == pytest.approx(expected, rel=1e-15)
    np.testing.assert_array_equal(simulate_run(np.ones(M), n).forwards, exact)


@pytest.mark.parametrize("M", [1, 7], ids=lambda M: f"M{M}")
def test_all_rejected_is_one_token_per_forward(M: int) -> None:
    """a = 0 decodes like an autoregressive decoder: the prefill and every later forward commit
    one token each, so F(n) = n and the run TPF is exactly 1."""
    np.testing.assert_array_equal(expected_forwards(np.zeros(M), 50), np.arange(51))
    assert run_tpf(np.zeros(M), [1, 5, 50]) == 1.0
    np.testing.assert_array_equal(simulate_run(np.zeros(M), [1, 5, 50]).forwards, [1, 5, 50])


def test_run_tpf_is_a_ratio_of_sums_and_batches() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.3, 1.0, size=(4, 3, 5))
    lengths = rng.integers(1, 80, size=25)
    out = run_tpf(a, lengths)
    assert isinstance(out, np.ndarray)
    assert out.shape == (4, 3)
    forwards = expected_forwards(a[2, 1], 80)
    assert out[2, 1] == pytest.approx(lengths.sum() / forwards[lengths].sum(), rel=1e-12)
    assert run_tpf(a[2, 1], lengths[::-1].reshape(5, 5)) == pytest.approx(out[2, 1], rel=1e-12)
    assert isinstance(run_tpf(a[0, 0].tolist(), [3]), float)  # 0-d results are numpy scalars
    assert run_tpf(a.astype(np.float32), lengths).dtype == np.float32


def test_torch_keeps_autograd() -> None:
    a = torch.tensor([0.9, 0.7, 0.8], dtype=torch.float64, requires_grad=True)
    out = run_tpf(a, [5, 12, 30])
    assert isinstance(out, torch.Tensor)
    assert out.item() == pytest.approx(run_tpf(a.detach().numpy(), [5, 12, 30]), rel=1e-12)
    out.backward()
    assert a.grad is not None
    assert (a.grad > 0).all()  # a better profile never costs forwards
    torch.autograd.gradcheck(lambda x: run_tpf(x, [5, 12, 30]), (a.detach().requires_grad_(),))
    assert isinstance(simulate_run(a, [4, 9]).forwards, torch.Tensor)
    assert expected_forwards(a.float(), 9).dtype == torch.float32


def _observed_profile(a: np.ndarray, blocks: int, rng: np.random.Generator) -> AcceptanceProfile:
    lengths = rng.choice(a.size + 1, size=blocks, p=accept_length_pmf(a))
    return AcceptanceProfile.from_accept_lengths(lengths, a.size)


@pytest.mark.parametrize(
    ("a", "renewal_outside"),
    [
        pytest.param([0.85, 0.75, 0.6], False, id="M3-falling"),
        pytest.param([0.95, 0.9, 0.9, 0.85, 0.85, 0.8, 0.8], True, id="M7-N8"),
    ],
)
def test_predictive_interval_covers_simulated_runs(a: list[float], renewal_outside: bool) -> None:
    """Run A measures a profile (300 verify rounds); run B (30 responses of 4..40 tokens) is
    decoded with the true profile. B's whole-run TPF falls in the 95 % interval predicted from
    A's profile in ≥ 90 % of 200 seeded replications (95 % expected). At N = 8 the
    complete-cycle TPF of the true profile, which ignores cold starts and cut-off cycles, lies
    outside nearly every interval (at M = 3 the gap is about one interval width)."""
    truth = np.asarray(a)
    rng = np.random.default_rng(2024)
    covered = renewal_inside = 0
    replications = 200
    for _ in range(replications):
        profile = _observed_profile(truth, 300, rng)
        lengths = rng.integers(4, 41, size=30)
        measured = float(simulate_run(truth, lengths, seed=rng).tpf)
        prediction = predict_run_tpf(profile, lengths, level=0.95, draws=200, seed=rng)
        assert prediction.low <= prediction.point <= prediction.high
        covered += prediction.low <= measured <= prediction.high
        renewal_inside += prediction.low <= tpf(truth) <= prediction.high
    assert covered >= 0.9 * replications
    if renewal_outside:
        assert renewal_inside <= 0.1 * replications


def test_prediction_point_seed_and_edges() -> None:
    a = np.array([0.9, 0.6, 0.8])
    profile = _observed_profile(a, 500, np.random.default_rng(0))
    lengths = [8, 16, 32, 64]
    first = predict_run_tpf(profile, lengths, draws=300, seed=3)
    assert isinstance(first, RunTPFPrediction)
    assert first == predict_run_tpf(profile, lengths, draws=300, seed=3)
    assert first.plugin == pytest.approx(run_tpf(profile.rates(), lengths), rel=1e-12)
    assert first.low <= first.point <= first.high
    assert first.level == 0.95
    assert first.draws == 300
    assert "(predictive median, 95% predictive interval)" in str(first)
    names = [f.name for f in dataclasses.fields(first)]
    assert names == ["point", "low", "high", "level", "draws", "plugin"]
    made = RunTPFPrediction(3.0, 2.5, 3.5, 0.9, 100, 4.0)
    assert str(made) == "3.000 [2.500, 3.500] (predictive median, 90% predictive interval)"
    narrow = predict_run_tpf(profile, lengths, level=0.5, draws=300, seed=3)
    assert first.low <= narrow.low <= narrow.high <= first.high
    nothing = predict_run_tpf(AcceptanceProfile.empty(3), lengths, draws=50)
    assert math.isnan(nothing.plugin)  # no data: no MLE, the prior's median and interval
    assert 1.0 <= nothing.low <= nothing.point <= nothing.high <= 4.0
    perfect = predict_run_tpf(AcceptanceProfile.from_accept_lengths([3] * 50, 3), [9], draws=50)
    assert perfect.plugin == 9 / 4  # prefill + cold start + 2 full rounds (4 and 3 tokens)
    assert perfect.low <= perfect.point <= perfect.high <= perfect.plugin


@settings(max_examples=30, deadline=None)
@given(
    M=st.sampled_from([1, 3, 7]),
    full=st.integers(0, 400),
    rejected=st.integers(0, 10),
    lengths=st.lists(st.integers(1, 80), min_size=1, max_size=12),
)
def test_prediction_holds_its_point(M: int, full: int, rejected: int, lengths: list[int]) -> None:
    """The predictive median lies inside the predictive interval, near TPF's maximum too."""
    profile = AcceptanceProfile.from_accept_lengths([M] * full + [0] * rejected, M)
    prediction = predict_run_tpf(profile, lengths, draws=100, seed=0)
    assert prediction.low <= prediction.point <= prediction.high
