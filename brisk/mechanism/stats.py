"""Equal-request averaging and the request-clustered bootstrap; means across seeds.

For a statistic with per-request numerator n_r and denominator d_r (event counts summed over
the request's blocks):

- the **equal-request** rate is (1/|R⁺|) Σ_{r ∈ R⁺} n_r / d_r over the requests R⁺ with
  d_r > 0; requests with d_r = 0 (e.g. no first breaker) have no rate and are *excluded from
  that statistic's mean* (the count is reported as ``excluded``), never counted as zero;
- the **pooled** rate Σ_r n_r / Σ_r d_r weights requests by their events (reported beside it);
- the interval resamples whole requests with replacement (events of one request are
  correlated) and takes equal-tailed percentiles of each rate over the draws.

Resampling is canonical: requests are indexed in sorted request-id order and draw b uses the
generator seeded with (seed, b), so the same set of requests gives the same intervals however
its blocks were ordered or split into files. Every statistic of one report shares the draws.

Across independent runs (seeds of a training arm, repeats of a benchmark) the unit is the run:
:class:`Interval` is the mean of k per-run values with its Student-t interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Bootstrap", "Interval", "Mean", "Rate", "RateArray"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_CHUNK = 64  # draws per matrix product, at most _CHUNK_ENTRIES weights (32 MB) at a time
_CHUNK_ENTRIES = 1 << 22
_CACHE_ENTRIES = 16_000_000  # keep all weights (float32, ≤ 64 MB) when they fit


class _Numbers:
    """A dataclass of numbers whose :meth:`to_dict` gives its fields for JSON, in order, a NaN
    or infinite value as null."""

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_number(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class _EqualRequest(_Numbers):
    """An equal-request estimate with its interval, and the pooled value beside it."""

    equal_request: float
    low: float
    high: float
    pooled: float


@dataclass(frozen=True)
class Rate(_EqualRequest):
    """One rate: equal-request estimate with its interval, and the pooled rate beside it."""

    numerator: int
    denominator: int
    requests: int
    excluded: int


@dataclass(frozen=True, eq=False)
class RateArray:
    """Rates along a trailing axis (positions, or K' for coverage); fields as in :class:`Rate`."""

    equal_request: FloatArray
    low: FloatArray
    high: FloatArray
    pooled: FloatArray
    numerator: IntArray
    denominator: IntArray
    requests: IntArray
    excluded: IntArray

    def __len__(self) -> int:
        return int(self.equal_request.shape[0])

    def __getitem__(self, i: int) -> Rate:
        return Rate(
            float(self.equal_request[i]),
            float(self.low[i]),
            float(self.high[i]),
            float(self.pooled[i]),
            int(self.numerator[i]),
            int(self.denominator[i]),
            int(self.requests[i]),
            int(self.excluded[i]),
        )

    def slice(self, start: int, stop: int) -> RateArray:
        """Entries start..stop − 1 as a new :class:`RateArray`."""
        return RateArray(
            self.equal_request[start:stop],
            self.low[start:stop],
            self.high[start:stop],
            self.pooled[start:stop],
            self.numerator[start:stop],
            self.denominator[start:stop],
            self.requests[start:stop],
            self.excluded[start:stop],
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: [_json_number(x) for x in v.tolist()] for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Mean(_EqualRequest):
    """Equal-request mean of a per-block quantity (e.g. ΔL in nats) and the pooled mean.

    Requests without an observation (``count`` 0) are excluded from the equal-request mean.
    """

    count: int
    requests: int
    excluded: int


@dataclass(frozen=True)
class Interval(_Numbers):
    """Mean of k per-seed values with a two-sided Student-t interval (NaN bounds when k = 1);
    :meth:`to_dict` writes a NaN bound as null.

    >>> iv = Interval.of([1.0, 2.0, 3.0], level=0.95)
    >>> iv.mean, iv.k, iv.format(digits=1)
    (2.0, 3, '2.0 [-0.5, 4.5]')
    >>> Interval.of([2.5]).format()
    '2.50'
    """

    mean: float
    low: float
    high: float
    k: int

    @classmethod
    def of(cls, values: Sequence[float], level: float = 0.95) -> Interval:
        """mean ± t_{(1 + level)/2, k − 1} · s / √k, s the sample standard deviation."""
        from scipy import stats  # ~0.5 s to import: only when an interval is asked for

        if not 0 < level < 1:
            raise ValueError(f"level: must lie in (0, 1), got {level!r}")
        xs = [float(v) for v in values]
        if not xs:
            raise ValueError("values: need at least one value")
        k = len(xs)
        mean = sum(xs) / k
        if k == 1:
            return cls(mean, math.nan, math.nan, 1)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (k - 1))
        half = float(stats.t.ppf((1 + level) / 2, k - 1)) * sd / math.sqrt(k)
        return cls(mean, mean - half, mean + half, k)

    def format(self, scale: float = 1.0, digits: int = 2) -> str:
        """``mean [low, high]`` scaled by ``scale``; the mean alone when k = 1."""
        m = f"{self.mean * scale:.{digits}f}"
        if self.k == 1:
            return m
        return f"{m} [{self.low * scale:.{digits}f}, {self.high * scale:.{digits}f}]"


def _json_number(x: float | int) -> float | int | None:
    return None if isinstance(x, float) and not np.isfinite(x) else x


class Bootstrap:
    """Equal-request rates with request-clustered percentile intervals.

    ``request_ids`` must be sorted and unique (as :class:`~brisk.mechanism.tally.RequestTally`
    keeps them); ``draws = 0`` skips the intervals (NaN).
    """

    def __init__(
        self, request_ids: IntArray, draws: int = 1000, seed: int = 0, level: float = 0.95
    ) -> None:
        ids = np.asarray(request_ids)
        if ids.ndim != 1 or (ids.size > 1 and not np.all(ids[1:] > ids[:-1])):
            raise ValueError("request_ids: need sorted unique ids")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
            raise ValueError(f"draws: need an integer ≥ 0, got {draws!r}")
        if not 0 < level < 1:
            raise ValueError(f"level: must lie strictly between 0 and 1, got {level!r}")
        self.R, self.draws, self.seed, self.level = ids.size, draws, seed, level
        self._cache: dict[int, npt.NDArray[np.float32]] = {}

    def weights(self, start: int, stop: int) -> FloatArray:
        """Resampling multiplicities [stop − start, R] of draws start..stop − 1."""
        cached = self._cache.get(start)
        if cached is not None and cached.shape[0] == stop - start:
            return cached.astype(np.float64)
        out = np.empty((stop - start, self.R))
        for row, b in enumerate(range(start, stop)):
            pick = np.random.default_rng([self.seed, b]).integers(0, self.R, self.R)
            out[row] = np.bincount(pick, minlength=self.R)
        if self.draws * self.R <= _CACHE_ENTRIES:
            # every statistic reuses the draws; counts ≤ R are exact in float32
            self._cache[start] = out.astype(np.float32)
        return out

    def rates(self, num: npt.ArrayLike, den: npt.ArrayLike) -> RateArray:
        """Rates for per-request counts ``num``, ``den`` of shape [R, C] (or [R])."""
        n = np.asarray(num, dtype=np.int64)
        d = np.asarray(den, dtype=np.int64)
        n, d = n.reshape(self.R, -1), d.reshape(self.R, -1)
        if n.shape != d.shape:
            raise ValueError(f"num and den: shapes {n.shape} and {d.shape} differ")
        if np.any((n < 0) | (n > d)):
            raise ValueError("num: need 0 ≤ num ≤ den for every request")
        valid = d > 0
        per_request = np.where(valid, n / np.maximum(d, 1), 0.0)
        n_valid = valid.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            equal = np.where(n_valid > 0, per_request.sum(axis=0) / n_valid, np.nan)
            pooled = np.where(d.sum(axis=0) > 0, n.sum(axis=0) / d.sum(axis=0), np.nan)
        low, high = self._interval(per_request, valid.astype(np.float64))
        return RateArray(
            equal,
            low,
            high,
            pooled,
            n.sum(axis=0),
            d.sum(axis=0),
            n_valid.astype(np.int64),
            (self.R - n_valid).astype(np.int64),
        )

    def means(self, total: npt.ArrayLike, count: npt.ArrayLike) -> list[Mean]:
        """Equal-request means of total_r / count_r for [R, C] (or [R]) per-request sums."""
        t = np.asarray(total, dtype=np.float64).reshape(self.R, -1)
        c = np.asarray(count, dtype=np.int64).reshape(self.R, -1)
        valid = c > 0
        per_request = np.where(valid, t / np.maximum(c, 1), 0.0)
        n_valid = valid.sum(axis=0)
        low, high = self._interval(per_request, valid.astype(np.float64))
        out = []
        for j in range(t.shape[1]):
            nv, count_j = int(n_valid[j]), int(c[:, j].sum())
            out.append(
                Mean(
                    float(per_request[:, j].sum() / nv) if nv else float("nan"),
                    float(low[j]),
                    float(high[j]),
                    float(t[:, j].sum() / count_j) if count_j else float("nan"),
                    count_j,
                    nv,
                    self.R - nv,
                )
            )
        return out

    def _interval(self, values: FloatArray, valid: FloatArray) -> tuple[FloatArray, FloatArray]:
        C = values.shape[1]
        if self.draws == 0 or self.R == 0:
            return np.full(C, np.nan), np.full(C, np.nan)
        # many rates share a denominator mask (every K' of coverage, say): resample each once
        first: dict[bytes, int] = {}
        which = np.array([first.setdefault(col.tobytes(), j) for j, col in enumerate(valid.T)])
        keep = np.unique(which)
        which = np.searchsorted(keep, which)
        stacked = np.concatenate([values, valid[:, keep]], axis=1)
        sums = np.empty((self.draws, stacked.shape[1]))
        chunk = max(1, min(_CHUNK, _CHUNK_ENTRIES // max(self.R, 1)))
        for start in range(0, self.draws, chunk):
            stop = min(start + chunk, self.draws)
            sums[start:stop] = self.weights(start, stop) @ stacked
        with np.errstate(invalid="ignore", divide="ignore"):
            draws = sums[:, :C] / sums[:, C:][:, which]
        tail = (1 - self.level) / 2
        ok = ~np.all(np.isnan(draws), axis=0)
        low, high = np.full(C, np.nan), np.full(C, np.nan)
        if ok.any():
            q = np.nanquantile(draws[:, ok], [tail, 1 - tail], axis=0)
            low[ok], high[ok] = q[0], q[1]
        return low, high
