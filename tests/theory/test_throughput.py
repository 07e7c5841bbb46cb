"""The step-time model: TPF gains exceed wall-clock gains once overhead is paid."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brisk.theory import break_even_overhead, tokens_per_second, wall_clock_speedup


def test_tokens_per_second() -> None:
    assert tokens_per_second(4.0, forward_s=0.02) == pytest.approx(200.0)
    assert tokens_per_second(4.0, 0.02, overhead_s=0.005, concurrency=8) == pytest.approx(1280.0)
    out = tokens_per_second(np.array([2.0, 4.0]), 0.02)
    np.testing.assert_allclose(out, [100.0, 200.0])
    assert isinstance(tokens_per_second(torch.tensor([2.0]), 0.02), torch.Tensor)


def test_wall_clock_gain_is_below_tpf_gain_with_overhead() -> None:
    tpf_ratio = 5.0 / 4.0
    speedup = wall_clock_speedup(4.0, 5.0, forward_s=0.03, overhead_s=0.003)
    assert 1.0 < speedup < tpf_ratio
    assert wall_clock_speedup(4.0, 5.0, forward_s=0.03) == pytest.approx(tpf_ratio)


def test_break_even_overhead_equalizes_throughput() -> None:
    budget = break_even_overhead(4.0, 5.0, forward_s=0.03, base_overhead_s=0.001)
    assert budget == pytest.approx(0.031 * 0.25)
    assert tokens_per_second(5.0, 0.03, overhead_s=0.001 + budget) == pytest.approx(
        tokens_per_second(4.0, 0.03, overhead_s=0.001)
    )
    assert break_even_overhead(5.0, 4.0, forward_s=0.03) < 0
