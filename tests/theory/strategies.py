"""Hypothesis strategies for acceptance profiles and cost models."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from brisk.theory import CostModel

EXTREMES = (0.0, 1.0, 1e-12, 1.0 - 1e-12)

rates = st.one_of(st.sampled_from(EXTREMES), st.floats(0.0, 1.0))
"""One acceptance probability, with the edges a ∈ {0, 1} and near-edges drawn often."""

sizes = st.one_of(st.sampled_from([1, 2, 7, 15]), st.integers(1, 15))


@st.composite
def profiles(draw: st.DrawFn, M: int | None = None) -> np.ndarray:
    """A profile a: [M] with M in 1..15 (M = 1, 2, 7, 15 favoured)."""
    m = M if M is not None else draw(sizes)
    return np.array(draw(st.lists(rates, min_size=m, max_size=m)))


@st.composite
def cost_models(draw: st.DrawFn, M: int, monotone: bool = False) -> CostModel:
    """A random valid cost model; ``monotone`` gives non-decreasing gains, non-increasing costs."""
    gains = draw(st.lists(st.floats(0.1, 20.0), min_size=M + 1, max_size=M + 1))
    costs = draw(st.lists(st.floats(0.1, 10.0), min_size=M + 1, max_size=M + 1))
    if monotone:
        gains, costs = sorted(gains), sorted(costs, reverse=True)
    return CostModel(tuple(gains), tuple(costs))


@st.composite
def profile_and_cost(draw: st.DrawFn, monotone: bool = False) -> tuple[np.ndarray, CostModel]:
    """A profile with a preset or random cost model of the same M."""
    a = draw(profiles())
    M = a.size
    presets = [CostModel.isd(M), CostModel.speculative(M), CostModel.speculative(M, 0.3)]
    cost = draw(st.one_of(st.sampled_from(presets), cost_models(M, monotone)))
    return a, cost
