"""Progress weights: closed form vs autodiff (eq:brisk_weighting), normalization, baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from brisk.theory import (
    CostModel,
    decay_weights,
    dpace_weights,
    fpt,
    progress_weights,
    uniform_weights,
)
from tests.theory.strategies import cost_models, profile_and_cost, profiles


@settings(max_examples=200)
@given(data=profile_and_cost())
def test_analytic_matches_autodiff(data: tuple[np.ndarray, CostModel]) -> None:
    a, cost = data
    raw = progress_weights(a, cost, normalize=False)
    raw_ad = progress_weights(a, cost, normalize=False, method="autodiff")
    np.testing.assert_allclose(raw, raw_ad, rtol=0, atol=1e-10)
    denominator = raw.sum() + 1e-8
    if abs(denominator) > 1e-6:  # normalization is ill-conditioned only near Σ w^raw = −ε
        np.testing.assert_allclose(
            progress_weights(a, cost),
            progress_weights(a, cost, method="autodiff"),
            rtol=1e-10,
            atol=1e-10,
        )


@pytest.mark.parametrize("M", [1, 15], ids=["M1", "M15"])
@settings(max_examples=200)
@given(data=st.data())
def test_analytic_matches_autodiff_at_edge_sizes(M: int, data: st.DataObject) -> None:
    a = data.draw(profiles(M))
    cost = data.draw(st.one_of(st.just(CostModel.isd(M)), cost_models(M)))
    np.testing.assert_allclose(
        progress_weights(a, cost, normalize=False),
        progress_weights(a, cost, normalize=False, method="autodiff"),
        rtol=0,
        atol=1e-10,
    )


@settings(max_examples=200)
@given(data=profile_and_cost(monotone=True))
def test_normalized_weights_have_mean_one(data: tuple[np.ndarray, CostModel]) -> None:
    a, cost = data
    raw = progress_weights(a, cost, normalize=False)
    w = progress_weights(a, cost)
    assert (raw >= -1e-15).all()  # monotone cost models: improving any position never hurts
    total = raw.sum()
    # mean(w̄) = S / (S + ε) exactly; ≈ 1 whenever S ≫ ε.
    assert w.mean() == pytest.approx(total / (total + 1e-8), rel=1e-12, abs=1e-15)
    if total > 1e-4:
        assert w.mean() == pytest.approx(1.0, abs=1e-4)


def test_raw_weight_is_minus_fpt_derivative_in_log_odds() -> None:
    a = np.array([0.6, 0.9, 0.75, 0.95])
    z = np.log(a / (1 - a))
    h = 1e-6
    for i in range(a.size):
        zp, zm = z.copy(), z.copy()
        zp[i] += h
        zm[i] -= h
        numeric = -(fpt(1 / (1 + np.exp(-zp))) - fpt(1 / (1 + np.exp(-zm)))) / (2 * h)
        assert progress_weights(a, normalize=False)[i] == pytest.approx(numeric, rel=1e-6)


def test_edges_are_legal_and_zero_weighted() -> None:
    w = progress_weights([1.0, 0.5, 0.0, 0.7], normalize=False)
    assert w[0] == 0.0  # a = 1: log-odds infinite, nothing left to gain
    assert w[2] == 0.0  # a = 0: likewise
    assert w[3] == 0.0  # unreachable behind a = 0
    assert w[1] > 0
    assert (progress_weights(np.ones(5)) == 0).all()


def test_batched_torch_weights_carry_no_gradient() -> None:
    a = torch.rand(6, 7, dtype=torch.float64, requires_grad=True)
    for method in ("analytic", "autodiff"):
        w = progress_weights(a, method=method)
        assert isinstance(w, torch.Tensor)
        assert w.shape == (6, 7)
        assert not w.requires_grad
        torch.testing.assert_close(w.mean(-1), torch.ones(6, dtype=torch.float64))
    assert a.grad is None


def test_early_weak_profile_weights_early_positions() -> None:
    early_weak = progress_weights([0.6, 0.7, 0.9, 0.95, 0.95, 0.95, 0.95])
    late_weak = progress_weights([0.97, 0.97, 0.95, 0.9, 0.8, 0.7, 0.6])
    assert early_weak.argmax() < 2
    assert late_weak.argmax() > 1
    assert early_weak[0] > late_weak[0]


def test_baselines() -> None:
    np.testing.assert_array_equal(uniform_weights(4), np.ones(4))
    raw = decay_weights(7, gamma=7.0, normalize=False)
    np.testing.assert_allclose(raw, np.exp(-np.arange(7) / 7.0))
    assert decay_weights(7).mean() == pytest.approx(1.0)
    q = np.array([[0.8, 0.6, 0.4]])
    smoothed = 0.5 * q + 0.5
    prefix = np.cumprod(smoothed, axis=-1)
    expected = np.array([[prefix.sum(), prefix[0, 1:].sum(), prefix[0, 2]]])
    np.testing.assert_allclose(dpace_weights(q, normalize=False), expected)
    assert dpace_weights(q).mean() == pytest.approx(1.0, abs=1e-8)
    assert dpace_weights(torch.tensor(q)).shape == (1, 3)
