"""Acceptance profiles: counting under the first-rejection rule, intervals, EMA tracking."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
    TPFInterval,
    accept_length_pmf,
    tpf,
)


def _leading_run(row: np.ndarray) -> int:
    n = 0
    for hit in row:
        if not hit:
            break
        n += 1
    return n


def test_counts_from_lengths_by_hand() -> None:
    # L = 0: position 1 reached, rejected. L = 2: positions 1-3 reached, 1-2 accepted.
    # L = 3 = M: every position reached and accepted.
    p = AcceptanceProfile.from_accept_lengths(np.array([0, 2, 3, 3]), M=3)
    assert p.reached.tolist() == [4, 3, 3]
    assert p.accepted.tolist() == [3, 3, 2]
    assert p.reached.dtype == np.int64
    assert p.n_blocks == 4
    np.testing.assert_allclose(p.rates(), [0.75, 1.0, 2 / 3])


@settings(max_examples=200)
@given(matches=arrays(np.bool_, st.tuples(st.integers(0, 30), st.integers(1, 9))))
def test_from_matches_applies_first_rejection_rule(matches: np.ndarray) -> None:
    M = matches.shape[1]
    lengths = [_leading_run(row) for row in matches]
    profile = AcceptanceProfile.from_matches(matches)
    assert profile == AcceptanceProfile.from_accept_lengths(lengths, M)
    for i in range(M):
        assert profile.reached[i] == sum(length >= i for length in lengths)
        assert profile.accepted[i] == sum(length >= i + 1 for length in lengths)
    assert AcceptanceProfile.from_matches(torch.from_numpy(matches)) == profile


@settings(max_examples=200)
@given(
    first=st.lists(st.integers(0, 5), max_size=40), second=st.lists(st.integers(0, 5), max_size=40)
)
def test_merge_equals_pooling(first: list[int], second: list[int]) -> None:
    build = AcceptanceProfile.from_accept_lengths
    merged = build(first, 5) + build(second, 5)
    assert merged == build(first + second, 5)
    rates = merged.rates()
    reached = merged.reached > 0
    assert ((rates[reached] >= 0) & (rates[reached] <= 1)).all()
    assert np.isnan(rates[~reached]).all()


def test_unreached_positions_are_undefined_not_zero() -> None:
    p = AcceptanceProfile.from_accept_lengths([0, 0, 1], M=4)  # positions 3, 4 never reached
    rates = p.rates()
    assert np.isnan(rates[2:]).all()
    low, high = p.interval()
    assert (low[2:] == 0).all()
    assert (high[2:] == 1).all()
    # Position 3 is unreached but the estimated survival to it is 0: TPF is still defined.
    assert p.tpf() == pytest.approx(float(tpf([1 / 3, 0.0, 0.0, 0.0])))
    assert np.isnan(AcceptanceProfile.empty(4).tpf())
    gap = AcceptanceProfile(np.array([5, 0]), np.array([5, 0]))  # survival 1 but a_2 unknown
    assert np.isnan(gap.tpf())


def test_jeffreys_interval_edges_and_width() -> None:
    p = AcceptanceProfile(np.array([10, 10, 1000]), np.array([0, 10, 500]))
    low, high = p.interval(0.95)
    assert low[0] == 0
    assert high[0] < 0.25
    assert high[1] == 1
    assert low[1] > 0.75
    assert low[2] < 0.5 < high[2]
    assert high[2] - low[2] < 0.07
    wide_low, wide_high = p.interval(0.99)
    assert (wide_low <= low).all()
    assert (wide_high >= high).all()


def test_jeffreys_interval_coverage() -> None:
    # Frequentist coverage of the 95 % Jeffreys interval at a = 0.3, n = 50 is ~0.95
    # (Brown, Cai & DasGupta 2001). Over 4000 replicates the estimate has sd 0.0035;
    # the bounds are ~6 sd wide.
    rng = np.random.default_rng(7)
    accepted = rng.binomial(50, 0.3, size=4000)
    p = AcceptanceProfile(np.full(4000, 50), accepted)
    low, high = p.interval(0.95)
    coverage = np.mean((low <= 0.3) & (high >= 0.3))
    assert 0.925 <= coverage <= 0.975


def test_tpf_interval_covers_the_true_tpf() -> None:
    # 200 replicate logs of 400 blocks from a known profile: the 90 % credible interval should
    # cover the true ISD TPF about 90 % of the time (sd of the coverage estimate 0.021).
    a = np.array([0.9, 0.85, 0.8, 0.8, 0.75, 0.7, 0.7])
    truth = float(tpf(a))
    rng = np.random.default_rng(11)
    pmf = accept_length_pmf(a)
    hits = 0
    for rep in range(200):
        lengths = rng.choice(8, size=400, p=pmf)
        interval = AcceptanceProfile.from_accept_lengths(lengths, 7).tpf_interval(
            level=0.9, draws=2000, seed=rep
        )
        assert interval.low <= interval.estimate <= interval.high
        hits += interval.low <= truth <= interval.high
    assert 0.80 <= hits / 200 <= 0.97


def test_tpf_interval_is_seeded_and_honours_cost() -> None:
    p = AcceptanceProfile.from_accept_lengths([7, 7, 3, 0, 5, 7, 2], 7)
    assert p.tpf_interval(seed=1) == p.tpf_interval(seed=1)
    sd = p.tpf_interval(CostModel.speculative(7))
    assert sd.plugin == pytest.approx(1 + np.cumprod(p.rates()).sum())
    assert "(posterior median, 95% credible interval)" in str(sd)


def test_interval_constructor_leads_with_its_median() -> None:
    # The interval's fields live in a base shared with RunTPFPrediction; the median comes first.
    i = TPFInterval(3.0, 2.5, 3.5, 0.9, 100, 4.0)
    names = [f.name for f in dataclasses.fields(i)]
    assert names == ["estimate", "low", "high", "level", "draws", "plugin"]
    assert str(i) == "3.000 [2.500, 3.500] (posterior median, 90% credible interval)"


def test_tracker_is_an_exponential_average() -> None:
    tracker = ProfileTracker(M=3, decay=0.9)
    batches = [[0, 3, 3], [1, 1, 2], [3, 3, 3, 0]]
    reached, accepted = np.zeros(3), np.zeros(3)
    for lengths in batches:
        batch = AcceptanceProfile.from_accept_lengths(lengths, 3)
        tracker.update(batch)
        reached = 0.9 * reached + batch.reached
        accepted = 0.9 * accepted + batch.accepted
    np.testing.assert_allclose(tracker.rates(), accepted / reached)
    assert tracker.profile().reached.tolist() == np.rint(reached).astype(int).tolist()
    assert tracker.updates == 3
    forgetful = ProfileTracker(M=3, decay=0.0)
    for lengths in batches:
        forgetful.update(AcceptanceProfile.from_accept_lengths(lengths, 3))
    assert forgetful.profile() == AcceptanceProfile.from_accept_lengths(batches[-1], 3)
    assert np.isnan(ProfileTracker(M=2).rates()).all()


def test_tracker_state_round_trips_and_posterior_mean() -> None:
    """A tracker restored from its state continues exactly like the original; its posterior
    mean is (accepted + ½)/(reached + 1) over the discounted counts."""
    a, b = ProfileTracker(M=3, decay=0.7), ProfileTracker(M=3, decay=0.7)
    batches = [AcceptanceProfile.from_accept_lengths(L, M=3) for L in ([0, 3, 1], [3, 3], [2])]
    a.update(batches[0])
    b.load_state_dict(a.state_dict())
    for batch in batches[1:]:
        a.update(batch)
        b.update(batch)
    assert a.state_dict() == b.state_dict()
    r = 0.7 * (0.7 * batches[0].reached + batches[1].reached) + batches[2].reached
    acc = 0.7 * (0.7 * batches[0].accepted + batches[1].accepted) + batches[2].accepted
    np.testing.assert_allclose(a.posterior_mean(), (acc + 0.5) / (r + 1), rtol=1e-15)
    with pytest.raises(ValueError, match=r"state: tracker of M = 3, decay 0\.7"):
        ProfileTracker(M=3, decay=0.9).load_state_dict(a.state_dict())


@st.composite
def _accept_histograms(draw: st.DrawFn) -> AcceptanceProfile:
    """Profiles from random accept-length histograms, often near TPF's maximum: most blocks
    fully accepted, a few or no rejections, from a handful to thousands of blocks."""
    M = draw(st.sampled_from([1, 2, 3, 7, 15]))
    full = draw(st.integers(0, 5000))
    short = draw(st.lists(st.integers(0, 40), min_size=M, max_size=M))
    if full + sum(short) == 0:
        full = 1
    return AcceptanceProfile.from_accept_lengths(np.repeat(np.arange(M + 1), [*short, full]), M)


@settings(max_examples=60, deadline=None)
@given(profile=_accept_histograms(), level=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_tpf_interval_holds_its_point(profile: AcceptanceProfile, level: float) -> None:
    """The point shown beside the interval lies inside it, for any profile (the plug-in TPF
    need not: with every block accepted it is the maximum N, which no posterior draw reaches)."""
    interval = profile.tpf_interval(level=level, draws=500, seed=1)
    assert interval.low <= interval.estimate <= interval.high
    assert interval.high <= profile.M + 1


def test_plugin_may_leave_the_interval_the_median_may_not() -> None:
    # The reported case: nearly every complete cycle accepted at N = 8.
    profile = AcceptanceProfile.from_accept_lengths([7] * 30 + [6, 3], 7)
    interval = profile.tpf_interval()
    assert interval.plugin > interval.high  # why the plug-in is not the point shown
    assert interval.low <= interval.estimate <= interval.high
