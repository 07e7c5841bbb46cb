"""Monte Carlo of the renewal-reward process behind TPF (paper, eq:nonuniform_tpf).

Each verify cycle draws an accepted-prefix length L from Pr(L = k), commits g_L tokens and
spends c_L forwards. Over n cycles, tokens / forwards → TPF by the renewal-reward theorem, with
standard error ≈ sd(g_L − TPF·c_L) / (E[c_L] √n) (delta method).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from brisk.theory._arrays import ArrayInput, to_kind, to_numpy
from brisk.theory.tpf import CostModel, _pmf, read_profile, resolve_cost

if TYPE_CHECKING:
    import torch

__all__ = ["SimulationResult", "simulate"]


@dataclass(frozen=True)
class SimulationResult:
    """Totals over ``cycles`` simulated verify cycles, batched like the input profile."""

    tokens: Any
    forwards: Any
    cycles: int

    @property
    def tpf(self) -> Any:
        """Measured tokens per forward."""
        return self.tokens / self.forwards


def simulate(
    a: ArrayInput | torch.Tensor,
    cost: CostModel | None = None,
    *,
    n_cycles: int,
    seed: int = 0,
) -> SimulationResult:
    """Simulate ``n_cycles`` verify cycles for each profile in a: ``[..., M]``.

    Drawing L independently per cycle and counting outcomes is the same as one multinomial
    draw of the outcome counts, which is what runs here (O(M) per profile, not O(n_cycles)).
    Returns totals of shape ``[...]`` in the input's kind.
    """
    t, kind = read_profile(a)
    if isinstance(n_cycles, bool) or not isinstance(n_cycles, int) or n_cycles < 1:
        raise ValueError(f"n_cycles: need a positive integer, got {n_cycles!r}")
    cost = resolve_cost(cost, t.shape[-1])
    pmf = _pmf(to_numpy(t).astype(np.float64))
    flat = pmf.reshape(-1, pmf.shape[-1])
    flat = flat / flat.sum(-1, keepdims=True)
    counts = np.random.default_rng(seed).multinomial(n_cycles, flat)
    tokens = (counts @ np.asarray(cost.gains)).reshape(pmf.shape[:-1])
    forwards = (counts @ np.asarray(cost.costs)).reshape(pmf.shape[:-1])
    return SimulationResult(to_kind(tokens, kind), to_kind(forwards, kind), n_cycles)
