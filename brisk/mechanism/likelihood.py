"""Whole-block replay (paper, eq:mech_block_logp): ΔL = L(b_head | c) − L(b_base | c).

L(b | c) = Σ_{i=1}^{M} log p(x_i | c, x_{<i}) is the verifier's log-likelihood of a block
scored under its own predecessor path from the shared producer prefix c (columns
``base_logp`` / ``head_logp``). A *paired* block has both; blocks missing either are skipped.

- mean ΔL: equal-request mean (per-request mean over its paired blocks, then the mean over
  requests with at least one pair), pooled mean beside it, in nats per M-token block;
- positive / tied / negative: shares of paired blocks with ΔL > 0, = 0, < 0. "Tied" means equal
  *recorded* likelihood (bitwise), which does not establish token identity.

ΔL is summed per request in fixed point (units of 2⁻³⁰ nats, ``LOGP_SCALE``) so totals are
exact and do not depend on the order of rows or files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.columns import BlockBatch
from brisk.mechanism.coverage import fixed_point
from brisk.mechanism.stats import Bootstrap, Mean, Rate

__all__ = ["LOGP_SCALE", "BlockLikelihood", "block_likelihood"]

LOGP_SCALE = 2**30
IntArray = npt.NDArray[np.int64]


def likelihood_features(batch: BlockBatch) -> dict[str, npt.NDArray[Any]]:
    """Per block: ``pairs`` (both scored), ``dl`` (fixed-point ΔL), ``dl_pos/tie/neg``."""
    delta = batch["head_logp"] - batch["base_logp"]
    paired = ~np.isnan(delta)
    return {
        "pairs": paired,
        "dl": np.where(paired, fixed_point(np.where(paired, delta, 0.0), LOGP_SCALE), 0),
        "dl_pos": paired & (delta > 0),
        "dl_tie": paired & (delta == 0),
        "dl_neg": paired & (delta < 0),
    }


@dataclass(frozen=True)
class BlockLikelihood:
    """Mean ΔL (nats per block) and the positive / tied / negative shares of paired blocks."""

    pairs: int
    mean_delta: Mean
    positive: Rate
    tied: Rate
    negative: Rate

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs} | {
            k: v.to_dict() for k, v in self.__dict__.items() if k != "pairs"
        }


def block_likelihood(sums: dict[str, IntArray], boot: Bootstrap) -> BlockLikelihood:
    """Whole-block statistics from per-request sums of :func:`likelihood_features`."""
    pairs = sums["pairs"][:, 0]
    (mean,) = boot.means(sums["dl"][:, 0] / LOGP_SCALE, pairs)
    shares = boot.rates(
        np.concatenate([sums["dl_pos"], sums["dl_tie"], sums["dl_neg"]], axis=1),
        np.repeat(pairs[:, None], 3, axis=1),
    )
    return BlockLikelihood(int(pairs.sum()), mean, shares[0], shares[1], shares[2])
