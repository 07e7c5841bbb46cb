"""The Monte Carlo renewal process agrees with eq:nonuniform_tpf within 5 sigma."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from brisk.theory import CostModel, accept_length_pmf, simulate, tpf
from tests.theory.strategies import profile_and_cost

N_CYCLES = 20_000


@settings(max_examples=200)
@given(data=profile_and_cost(), seed=st.integers(0, 2**32 - 1))
def test_simulation_agrees_with_tpf_within_5_sigma(
    data: tuple[np.ndarray, CostModel], seed: int
) -> None:
    a, cost = data
    result = simulate(a, cost, n_cycles=N_CYCLES, seed=seed)
    pmf = accept_length_pmf(a)
    g, c = np.asarray(cost.gains), np.asarray(cost.costs)
    rate = tpf(a, cost)
    # Delta method for a ratio of sums: sd(T/F) ≈ sd(g_L − TPF·c_L) / (E[c_L] √n).
    sigma = np.sqrt(pmf @ (g - rate * c) ** 2 / N_CYCLES) / (pmf @ c)
    assert abs(result.tpf - rate) <= 5 * sigma + 1e-9 * rate
    assert result.cycles == N_CYCLES


def test_batched_and_seeded() -> None:
    a = np.array([[0.9] * 7, [0.5] * 7])
    first = simulate(a, n_cycles=1000, seed=3)
    again = simulate(a, n_cycles=1000, seed=3)
    assert first.tokens.shape == (2,)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert (first.tokens > 0).all()
    assert (first.forwards >= 1000).all()  # every ISD cycle costs at least one forward
    out = simulate(torch.tensor(a), n_cycles=10, seed=0)
    assert isinstance(out.tokens, torch.Tensor)


def test_deterministic_profiles_are_exact() -> None:
    assert simulate([1.0] * 7, n_cycles=50).tpf == 8.0
    assert simulate([0.0] * 7, n_cycles=50).tpf == 1.0
