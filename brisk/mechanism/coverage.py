"""Candidate availability at first breakers (paper, tab:topk_main and tab:mechanism_summary).

At a first breaker let x* be the verifier's full-vocabulary top-1 and p* = p(x*). For every
K' ≤ K, with C_{K'} the K' highest-q candidates:

- coverage@K' = 1[x* ∈ C_{K'}]: the verifier's choice was available to a reranker;
- mass@K' = Σ p*·1[x* ∈ C_{K'}] / Σ p*: coverage weighted by the verifier's top-1 probability,
  i.e. the share of the top-1 probability mass the candidates capture (per request, then the
  equal-request mean; the pooled form weights every first breaker by its p*);
- set_mass@K' = mean of Σ_{k ≤ K'} p(C[k]): the verifier's total mass on C_{K'}.

Coverage describes support, not an oracle acceptance rate. Probability-weighted sums are kept
as integers in units of 2⁻³² (``PROB_SCALE``) so totals are exact and independent of row order;
the ``numerator``/``denominator`` of mass rates are in those units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.columns import BlockBatch
from brisk.mechanism.replay import BlockState
from brisk.mechanism.stats import Bootstrap, RateArray

__all__ = ["PROB_SCALE", "CandidateCoverage", "candidate_coverage", "fixed_point"]

PROB_SCALE = 2**32
IntArray = npt.NDArray[np.int64]


def fixed_point(x: npt.ArrayLike, scale: int) -> IntArray:
    """round(x · scale) as int64 (exact: scale is a power of two; ties go to even)."""
    return np.rint(np.asarray(x, dtype=np.float64) * scale).astype(np.int64)


def coverage_features(batch: BlockBatch, state: BlockState) -> dict[str, npt.NDArray[Any]]:
    """Per-block histograms: ``cov_rank`` / ``mass_rank`` [n, K + 1] over the rank of x* in C
    (K: not in C), ``top1_mass`` [n, 1] (p* in 2⁻³² units) and ``set_mass`` [n, K] (cumulative
    p over the first K' candidates), all zero for blocks without a first breaker."""
    n, K = len(batch), state.K
    rows = np.flatnonzero(state.accept_len < state.M)
    i = state.accept_len[rows]
    cand = batch["cand_ids"][rows, i]  # [nb, K]
    hit = cand == batch["verifier_top1"][rows, i][:, None]
    rank = np.where(hit.any(axis=1), hit.argmax(axis=1), K)
    w = fixed_point(batch["verifier_top1_prob"][rows, i], PROB_SCALE)
    cov = np.zeros((n, K + 1), dtype=np.int64)
    mass = np.zeros((n, K + 1), dtype=np.int64)
    cov[rows, rank] = 1
    mass[rows, rank] = w
    top1 = np.zeros((n, 1), dtype=np.int64)
    top1[rows, 0] = w
    set_mass = np.zeros((n, K), dtype=np.int64)
    # capped at 1: rounding K float32 values up can overshoot a total of exactly 1
    set_mass[rows] = np.minimum(
        np.cumsum(fixed_point(batch["p"][rows, i], PROB_SCALE), axis=1), PROB_SCALE
    )
    return {"cov_rank": cov, "mass_rank": mass, "top1_mass": top1, "set_mass": set_mass}


@dataclass(frozen=True)
class CandidateCoverage:
    """Coverage, mass and set mass at K' = 1..K (index K' − 1) over first breakers."""

    first_breakers: int
    coverage: RateArray
    mass: RateArray
    set_mass: RateArray

    def at(self, k: int) -> dict[str, float]:
        """Equal-request coverage, mass and set mass at K' = k."""
        if not 1 <= k <= len(self.coverage):
            raise ValueError(f"k: need 1 ≤ K' ≤ K = {len(self.coverage)}, got {k}")
        return {
            name: float(getattr(self, name).equal_request[k - 1])
            for name in ("coverage", "mass", "set_mass")
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_breakers": self.first_breakers,
            "K_prime": list(range(1, len(self.coverage) + 1)),
            "coverage": self.coverage.to_dict(),
            "mass": self.mass.to_dict(),
            "set_mass": self.set_mass.to_dict(),
        }


def candidate_coverage(sums: dict[str, IntArray], boot: Bootstrap) -> CandidateCoverage:
    """Rates for every K' from per-request sums of :func:`coverage_features`."""
    cov_rank, mass_rank = sums["cov_rank"], sums["mass_rank"]
    K = cov_rank.shape[1] - 1
    n_fb = cov_rank.sum(axis=1, keepdims=True)  # [R, 1]
    covered = np.cumsum(cov_rank[:, :K], axis=1)  # rank < K'
    captured = np.cumsum(mass_rank[:, :K], axis=1)
    rates = boot.rates(
        np.concatenate([covered, captured, sums["set_mass"]], axis=1),
        np.concatenate(
            [
                np.repeat(n_fb, K, 1),
                np.repeat(sums["top1_mass"], K, 1),
                np.repeat(n_fb * PROB_SCALE, K, 1),
            ],
            axis=1,
        ),
    )
    return CandidateCoverage(
        first_breakers=int(n_fb.sum()),
        coverage=rates.slice(0, K),
        mass=rates.slice(K, 2 * K),
        set_mass=rates.slice(2 * K, 3 * K),
    )
