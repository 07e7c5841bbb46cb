"""TPF against closed forms (the paper's §2.2 TPF_N(r), eq:nonuniform_tpf,
eq:idlm_tpf_instantiation) and input-kind contracts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from brisk.theory import (
    CostModel,
    accept_length_pmf,
    expected_accept_length,
    fpt,
    isd_tpf_uniform,
    speculative_tpf_uniform,
    survival,
    tpf,
)
from tests.theory.strategies import profile_and_cost, profiles, rates


@settings(max_examples=200)
@given(r=rates, stride=st.integers(2, 16))
def test_uniform_isd_profile_equals_tpf_n_of_r(r: float, stride: int) -> None:
    a = np.full(stride - 1, 1.0 - r)
    closed = (2 + sum((1 - r) ** i for i in range(1, stride - 1))) / (2 - (1 - r) ** (stride - 1))
    assert isd_tpf_uniform(r, stride) == pytest.approx(closed, rel=1e-12)
    assert tpf(a) == pytest.approx(closed, rel=1e-12)
    assert tpf(a, CostModel.isd(stride - 1)) == pytest.approx(closed, rel=1e-12)


@settings(max_examples=200)
@given(a=profiles())
def test_isd_preset_equals_idlm_tpf_instantiation(a: np.ndarray) -> None:
    A = np.cumprod(a)
    expected = (2 + A[:-1].sum()) / (2 - A[-1])
    assert tpf(a, CostModel.isd(a.size)) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=200)
@given(a=profiles(), draft_cost=st.floats(0.0, 3.0))
def test_speculative_preset_is_one_plus_sum_of_survival(a: np.ndarray, draft_cost: float) -> None:
    M = a.size
    expected = (1 + np.cumprod(a).sum()) / (1 + draft_cost)
    assert tpf(a, CostModel.speculative(M, draft_cost)) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=200)
@given(alpha=rates, M=st.integers(1, 15))
def test_speculative_uniform_closed_form(alpha: float, M: int) -> None:
    value = speculative_tpf_uniform(alpha, M)
    assert value == pytest.approx(tpf(np.full(M, alpha), CostModel.speculative(M)), rel=1e-12)
    if abs(1 - alpha) > 1e-3:
        assert value == pytest.approx((1 - alpha ** (M + 1)) / (1 - alpha), rel=1e-9)
    if alpha == 1.0:
        assert value == M + 1


@settings(max_examples=200)
@given(a=profiles())
def test_pmf_is_a_distribution_matching_survival(a: np.ndarray) -> None:
    pmf = accept_length_pmf(a)
    A = survival(a)
    assert pmf.shape == (a.size + 1,)
    assert (pmf >= 0).all()
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    # Pr(L ≥ k) = A_k, and E[L] = Σ_{k≥1} A_k.
    np.testing.assert_allclose(np.cumsum(pmf[::-1])[::-1], A, rtol=0, atol=1e-12)
    assert expected_accept_length(a) == pytest.approx((np.arange(a.size + 1) * pmf).sum())


@settings(max_examples=200)
@given(
    data=profile_and_cost(monotone=True),
    i=st.integers(0, 14),
    step=st.floats(0.0, 1.0),
)
def test_tpf_non_decreasing_in_every_position(
    data: tuple[np.ndarray, CostModel], i: int, step: float
) -> None:
    a, cost = data
    i %= a.size
    b = a.copy()
    b[i] = a[i] + step * (1 - a[i])
    assert tpf(b, cost) >= tpf(a, cost) * (1 - 1e-12)


@settings(max_examples=200)
@given(data=profile_and_cost())
def test_fpt_is_inverse_tpf(data: tuple[np.ndarray, CostModel]) -> None:
    a, cost = data
    assert fpt(a, cost) * tpf(a, cost) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    ("r", "expected"), [(0.0, 8.0), (0.10, 4.09), (0.15, 3.29), (0.20, 2.77)], ids=str
)
def test_paper_values_at_stride_8(r: float, expected: float) -> None:
    assert round(float(isd_tpf_uniform(r, 8)), 2) == expected
    assert round(float(tpf(np.full(7, 1 - r), CostModel.isd(7))), 2) == expected


def test_cost_model_presets() -> None:
    assert CostModel.isd(7).gains == (2, 3, 4, 5, 6, 7, 8, 8)
    assert CostModel.isd(7).costs == (2, 2, 2, 2, 2, 2, 2, 1)
    assert CostModel.isd(1) == CostModel((2.0, 2.0), (2.0, 1.0))
    sd = CostModel.speculative(3, draft_cost=0.5)
    assert sd.gains == (1, 2, 3, 4)
    assert sd.costs == (1.5,) * 4
    assert sd.M == 3


def test_kinds_and_batching() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(4, 3, 7))
    out = tpf(a)
    assert isinstance(out, np.ndarray)
    assert out.shape == (4, 3)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out[2, 1], tpf(a[2, 1]))
    assert isinstance(tpf(a[0, 0].tolist()), float)  # a 0-d result is a numpy scalar
    assert survival(a).shape == (4, 3, 8)
    assert tpf(a.astype(np.float32)).dtype == np.float32
    assert tpf([[1, 1, 0]]).dtype == np.float64


def test_torch_keeps_autograd() -> None:
    a = torch.tensor([[0.9, 0.8, 0.7]], dtype=torch.float64, requires_grad=True)
    out = tpf(a)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (1,)
    out.sum().backward()
    assert a.grad is not None
    assert (a.grad > 0).all()  # ISD TPF increases in every a_i
    pmf = accept_length_pmf(a.detach().float())
    assert pmf.dtype == torch.float32
