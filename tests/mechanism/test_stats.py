"""Equal-request averaging and the clustered bootstrap; the Student-t interval across seeds."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from brisk.mechanism import Bootstrap, Interval
from brisk.mechanism.stats import Mean, Rate


def test_equal_request_excludes_zero_denominators_and_pools_beside() -> None:
    boot = Bootstrap(np.array([1, 2, 3, 4]), draws=500, seed=1)
    r = boot.rates([[1], [0], [9], [0]], [[2], [0], [10], [4]])[0]
    assert r.equal_request == pytest.approx((0.5 + 0.9 + 0.0) / 3, abs=0)
    assert r.pooled == 10 / 16
    assert (r.requests, r.excluded, r.numerator, r.denominator) == (3, 1, 10, 16)
    assert 0 <= r.low <= r.equal_request <= r.high <= 1
    (m,) = boot.means([3.0, 0.0, -1.0, 2.0], [3, 0, 1, 4])
    assert (m.equal_request, m.pooled, m.excluded) == ((1 - 1 + 0.5) / 3, 4 / 8, 1)


def test_rate_and_mean_write_their_fields_in_order() -> None:
    r = Rate(0.5, 0.25, math.nan, 0.4, 2, 5, 3, 1)
    assert r.to_dict() == {
        "equal_request": 0.5,
        "low": 0.25,
        "high": None,
        "pooled": 0.4,
        "numerator": 2,
        "denominator": 5,
        "requests": 3,
        "excluded": 1,
    }
    assert list(r.to_dict()) == [f.name for f in dataclasses.fields(r)]
    m = Mean(1.5, 1.0, 2.0, math.inf, 7, 4, 0)
    assert list(m.to_dict().items()) == [
        ("equal_request", 1.5),
        ("low", 1.0),
        ("high", 2.0),
        ("pooled", None),
        ("count", 7),
        ("requests", 4),
        ("excluded", 0),
    ]


def test_bootstrap_is_seeded_and_resamples_whole_requests() -> None:
    ids = np.arange(50)
    a = Bootstrap(ids, draws=200, seed=7)
    w = a.weights(0, 200)
    assert np.all(w.sum(axis=1) == 50)
    np.testing.assert_array_equal(w, Bootstrap(ids, draws=200, seed=7).weights(0, 200))
    assert not np.array_equal(w, Bootstrap(ids, draws=200, seed=8).weights(0, 200))
    # the interval of a rate whose requests all agree has zero width
    r = a.rates(np.full((50, 1), 3), np.full((50, 1), 4))[0]
    assert r.low == r.high == 0.75
    with pytest.raises(ValueError, match="sorted unique"):
        Bootstrap(np.array([3, 1]))
    with pytest.raises(ValueError, match="num"):
        a.rates(np.full((50, 1), 5), np.full((50, 1), 4))


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=8), st.sampled_from([0.9, 0.95]))
def test_interval_is_the_student_t_interval(values: list[float], level: float) -> None:
    iv = Interval.of(values, level)
    mean, sem = np.mean(values), stats.sem(values)
    assert iv.mean == pytest.approx(mean, abs=1e-9)
    assert iv.k == len(values)
    if sem == 0:
        assert iv.low == pytest.approx(mean, abs=1e-9)
        assert iv.high == pytest.approx(mean, abs=1e-9)
        return
    low, high = stats.t.interval(level, len(values) - 1, loc=mean, scale=sem)
    assert (iv.low, iv.high) == pytest.approx((low, high), rel=1e-9, abs=1e-9)


def _coverage(width: float, arms: int = 4000) -> float:
    """Share of ``arms`` simulated arms (3 seeds each, N(1, 0.3)) whose interval, scaled about
    its mean by ``width``, covers the true mean 1."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(arms):
        iv = Interval.of(rng.normal(1.0, 0.3, 3).tolist())
        hits += abs(1.0 - iv.mean) <= width * (iv.high - iv.mean)
    return hits / arms


def test_interval_covers_the_mean_at_its_level() -> None:
    """3 seeds per arm, 4000 simulated arms: coverage 0.95 ± 3σ, σ = √(0.95·0.05/4000) ≈ 0.0034.
    Negative control: the normal-quantile half-width (1.96 / 4.30 of it at k = 3) covers far
    less (≈ 0.81), so a z-interval in place of the t-interval fails the same bound."""
    bound = 3 * math.sqrt(0.95 * 0.05 / 4000)
    assert abs(_coverage(1.0) - 0.95) <= bound
    z_over_t = 1.959963984540054 / 4.302652729911275
    assert abs(_coverage(z_over_t) - 0.95) > bound


def test_one_seed_has_no_interval() -> None:
    iv = Interval.of([2.5])
    assert iv.mean == 2.5
    assert math.isnan(iv.low)
    assert iv.format() == "2.50"
    assert json.dumps(iv.to_dict()) == '{"mean": 2.5, "low": null, "high": null, "k": 1}'


def test_interval_format_and_refusals() -> None:
    iv = Interval(0.5, 0.25, 0.75, 3)
    assert iv.format(scale=100, digits=1) == "50.0 [25.0, 75.0]"
    assert iv.to_dict() == {"mean": 0.5, "low": 0.25, "high": 0.75, "k": 3}
    with pytest.raises(ValueError, match="level: must lie in"):
        Interval.of([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError, match="at least one value"):
        Interval.of([])
