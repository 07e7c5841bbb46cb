"""Finite-horizon ISD: the exact DP for E[F(n)] against path enumeration, Monte Carlo of the
decoder's state machine, the renewal limit eq:idlm_tpf_instantiation and closed forms; and the
predictive interval of predict_run_tpf against simulated runs."""

from __future__ import annotations

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
from tests.theory.strategies import profiles


def enumerate_expected_forwards(a: np.ndarray, n: int) -> Fraction:
    """E[F(n)] by walking every path of the state machine, in exact arithmetic.

    Cold start: 1 forward, 1 token, then a verify round. Verify round: L = k with Pr(L = k),
    k + 1 tokens; warm again iff k = M. Stop once ≥ n tokens are committed.
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

    walk(0, False, Fraction(1), 0)
    return total


@settings(max_examples=200)
@given(a=st.integers(1, 3).flatmap(profiles), n_max=st.integers(0, 10))
def test_dp_equals_path_enumeration(a: np.ndarray, n_max: int) -> None:
    dp = expected_forwards(a, n_max)
    assert dp.shape == (n_max + 1,)
    exact = [float(enumerate_expected_forwards(a, n)) for n in range(n_max + 1)]
    np.testing.assert_allclose(dp, exact, rtol=1e-12, atol=1e-12)


RUNS = 4000


@settings(max_examples=200)
@given(a=profiles(), n=st.integers(1, 60))
def test_dp_equals_monte_carlo_within_5_sigma(a: np.ndarray, n: int) -> None:
    forwards = simulate_run(a, [n] * RUNS, seed=0).forwards
    assert forwards.shape == (RUNS,)
    assert forwards.min() >= math.ceil(n / (a.size + 1))  # a forward commits ≤ M + 1 tokens
    assert forwards.max() <= n  # and ≥ 1
    sigma = forwards.std(ddof=1) / math.sqrt(RUNS)
    assert abs(forwards.mean() - expected_forwards(a, n)[n]) <= 5 * sigma + 1e-9


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
    """(n − 1)/TPF ≤ E[F(n)] ≤ 1 + (n + M − 1)/TPF, so run TPF → TPF(a) at rate O(1/n)."""
    M, rate = a.size, float(tpf(a, CostModel.isd(a.size)))
    n = np.arange(501)
    forwards = expected_forwards(a, int(n[-1]))
    slack = 1e-9 * n
    assert (forwards[1:] >= (n[1:] - 1) / rate - slack[1:]).all()
    assert (forwards[1:] <= 1 + (n[1:] + M - 1) / rate + slack[1:]).all()
    long = run_tpf(a, [n[-1]])
    assert abs(long - rate) <= (rate + M - 1) / forwards[-1] + 1e-12


def test_run_tpf_approaches_the_renewal_tpf() -> None:
    a = np.array([0.9, 0.85, 0.8, 0.8, 0.75, 0.7, 0.7])
    gaps = [abs(run_tpf(a, [n]) - tpf(a)) for n in (10, 100, 1000, 10_000)]
    assert all(later < earlier / 5 for earlier, later in itertools.pairwise(gaps))
    assert gaps[-1] < 1e-3


@pytest.mark.parametrize("M", [1, 2, 7, 15], ids=lambda M: f"M{M}")
def test_all_accepted_closed_form(M: int) -> None:
    """a = 1: a cold start, then M + 1 tokens every forward: F(n) = 1 + ⌈(n − 1)/(M + 1)⌉."""
    n = np.arange(1, 301)
    exact = 1 + np.ceil((n - 1) / (M + 1))
    forwards = expected_forwards(np.ones(M), 300)
    assert forwards[0] == 0
    np.testing.assert_array_equal(forwards[1:], exact)
    lengths = np.random.default_rng(M).integers(1, 300, size=50)
    expected = lengths.sum() / (1 + np.ceil((lengths - 1) / (M + 1))).sum()
    assert run_tpf(np.ones(M), lengths) == pytest.approx(expected, rel=1e-15)
    np.testing.assert_array_equal(simulate_run(np.ones(M), n).forwards, exact)


@pytest.mark.parametrize("M", [1, 7], ids=lambda M: f"M{M}")
def test_all_rejected_is_one_token_per_forward(M: int) -> None:
    np.testing.assert_array_equal(expected_forwards(np.zeros(M), 50), np.arange(51))
    assert run_tpf(np.zeros(M), [1, 5, 50]) == 1.0


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
    narrow = predict_run_tpf(profile, lengths, level=0.5, draws=300, seed=3)
    assert first.low <= narrow.low <= narrow.high <= first.high
    nothing = predict_run_tpf(AcceptanceProfile.empty(3), lengths, draws=50)
    assert math.isnan(nothing.plugin)  # no data: no MLE, the prior's median and interval
    assert 1.0 <= nothing.low <= nothing.point <= nothing.high <= 4.0
    perfect = predict_run_tpf(AcceptanceProfile.from_accept_lengths([3] * 50, 3), [9], draws=50)
    assert perfect.plugin == 9 / 3  # 1 cold start + 2 full rounds of 4 tokens
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
