"""Marginal verified-progress weights (paper, eq:brisk_weighting) and the baselines they replace.

BRISK weighs the proposal loss of position i by how much a step in its log-odds
z_i = log(a_i / (1 − a_i)) lowers forwards per token:

    w_i^raw = −∂FPT/∂z_i = −∂FPT/∂a_i · a_i (1 − a_i),
    w̄_i     = M w_i^raw / (Σ_j w_j^raw + ε).

Closed form used by ``method="analytic"``. Write the renewal-reward numerator and denominator
by Abel summation over the survival A_k, with Δg_k = g_k − g_{k−1} and Δc_k = c_k − c_{k−1}:

    G = g_0 + Σ_{k=1}^{M} A_k Δg_k,    C = c_0 + Σ_{k=1}^{M} A_k Δc_k,    FPT = C / G.

Since ∂A_k/∂z_i = A_k (1 − a_i) for k ≥ i (and 0 for k < i), with suffix sums
S^g_i = Σ_{k≥i} A_k Δg_k and S^c_i = Σ_{k≥i} A_k Δc_k,

    w_i^raw = (1 − a_i) (C S^g_i − G S^c_i) / G².

No division by a_i or by 1 − a_i occurs, so a_i ∈ {0, 1} is legal (its weight is 0: the
log-odds there are infinite and a finite step in z moves nothing).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from brisk.theory._arrays import (
    Array,
    ArrayInput,
    FloatArray,
    as_array,
    check_positions,
    check_probabilities,
    cumprod,
    detach,
    full_like,
    is_tensor,
    suffix_sum,
    to_kind,
)
from brisk.theory.tpf import CostModel, _check_M, _tpf, read_profile, resolve_cost

if TYPE_CHECKING:
    import torch

__all__ = ["decay_weights", "dpace_weights", "progress_weights", "uniform_weights"]

Method = Literal["analytic", "autodiff"]


def _analytic(a: Array, cost: CostModel, normalize: bool, eps: float) -> Array:
    """Closed-form weights for a: ``[..., M]`` (module docstring), numpy or torch.

    Works position-major on ``[M, B]``: every step is one contiguous vector operation over the
    batch, done in place, which runs several times faster than scans along a short last axis.
    """
    g, c = cost.tensors(a)
    M = a.shape[-1]
    x = a.reshape(-1, M).T  # [M, B] view
    A = full_like(a, (M, x.shape[1]), 0.0)  # A_1..A_M
    A[0] = x[0]
    for k in range(1, M):
        A[k] = A[k - 1] * x[k]
    s_g = A * (g[1:] - g[:-1])[:, None]  # A_k Δg_k, then suffix sums S^g_k
    A *= (c[1:] - c[:-1])[:, None]
    s_c = A  # A_k Δc_k, then suffix sums S^c_k
    for k in range(M - 2, -1, -1):
        s_g[k] += s_g[k + 1]
        s_c[k] += s_c[k + 1]
    G = g[0] + s_g[0]  # [B]
    C = c[0] + s_c[0]  # [B]
    s_g *= C
    s_c *= G
    s_g -= s_c
    s_g /= G * G
    s_g *= 1 - x
    w = s_g  # w^raw, [M, B]
    if normalize:
        w *= M / (w.sum(0) + eps)
    return w.T.reshape(a.shape)


def _raw_autodiff(a: Array, cost: CostModel) -> torch.Tensor:
    """w^raw by torch.autograd (imports torch: a numpy caller asked for autodiff)."""
    import torch

    x = (a.detach().clone() if is_tensor(a) else torch.tensor(a)).requires_grad_(True)
    with torch.enable_grad():
        forwards_per_token = 1 / _tpf(x, cost)
        (grad,) = torch.autograd.grad(forwards_per_token.sum(), x)
    return -grad * x.detach() * (1 - x.detach())


def _normalize(w: Array, eps: float) -> Array:
    return w.shape[-1] * w / (w.sum(-1, keepdims=True) + eps)


@overload
def progress_weights(
    a: torch.Tensor,
    cost: CostModel | None = None,
    *,
    normalize: bool = True,
    eps: float = 1e-8,
    method: Method = "analytic",
) -> torch.Tensor: ...
@overload
def progress_weights(
    a: ArrayInput,
    cost: CostModel | None = None,
    *,
    normalize: bool = True,
    eps: float = 1e-8,
    method: Method = "analytic",
) -> FloatArray: ...
def progress_weights(
    a: ArrayInput | torch.Tensor,
    cost: CostModel | None = None,
    *,
    normalize: bool = True,
    eps: float = 1e-8,
    method: Method = "analytic",
) -> FloatArray | torch.Tensor:
    """BRISK weights w̄ (or w^raw with ``normalize=False``) for profiles a: ``[..., M]``.

    ``cost=None`` means ISD at stride M + 1. ``method="autodiff"`` differentiates FPT with
    torch.autograd instead of the closed form (and so imports torch, whatever the input's
    kind); both agree to float64 rounding. The result carries no gradient: the weights are
    fixed coefficients in the loss.

    >>> progress_weights([0.5, 0.9, 0.9]).round(3)  # the weak first position dominates
    array([2.44 , 0.344, 0.215])
    """
    t, kind = read_profile(a)
    cost = resolve_cost(cost, t.shape[-1])
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: must be finite and ≥ 0, got {eps!r}")
    if method == "analytic":
        w = _analytic(detach(t), cost, normalize, eps)
    elif method == "autodiff":
        raw = _raw_autodiff(t, cost)
        w = _normalize(raw, eps) if normalize else raw
    else:
        raise ValueError(f"method: expected 'analytic' or 'autodiff', got {method!r}")
    return to_kind(w, kind)  # type: ignore[no-any-return]


def uniform_weights(M: int) -> FloatArray:
    """Uniform baseline: w̄_i = 1 for i = 1..M. ``[M]``."""
    _check_M(M)
    return np.ones(M)


def decay_weights(M: int, gamma: float = 7.0, *, normalize: bool = True) -> FloatArray:
    """DFlash's fixed positional decay w_k = exp(−(k − 1)/γ), k = 1..M. ``[M]``.

    DFlash uses γ = 7 for blocks of 16. ``normalize=True`` rescales to mean one so the
    baselines share BRISK's loss scale.
    """
    _check_M(M)
    if not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma: must be finite and > 0, got {gamma!r}")
    w = np.exp(-np.arange(M) / gamma)
    return M * w / w.sum() if normalize else w


@overload
def dpace_weights(
    token_probs: torch.Tensor, alpha: float = 0.5, *, normalize: bool = True, eps: float = 1e-8
) -> torch.Tensor: ...
@overload
def dpace_weights(
    token_probs: ArrayInput, alpha: float = 0.5, *, normalize: bool = True, eps: float = 1e-8
) -> FloatArray: ...
def dpace_weights(
    token_probs: ArrayInput | torch.Tensor,
    alpha: float = 0.5,
    *,
    normalize: bool = True,
    eps: float = 1e-8,
) -> FloatArray | torch.Tensor:
    """D-PACE weights from the drafter's probability of each target token. ``[..., M]``.

    With q_j = exp(−CE_j) at proposal position j (the anchor is not a position here),
    q̃_j = (1 − α) q_j + α, prefix_m = ∏_{i≤m} q̃_i and w_j = Σ_{m≥j} prefix_m. Normalized
    per row to mean one (the per-sequence normalization D-PACE adopted upstream). Computed
    without gradient.
    """
    t, kind = as_array(token_probs, "token_probs")
    check_positions(t, "token_probs")
    check_probabilities(t, "token_probs")
    if not (math.isfinite(alpha) and 0 <= alpha <= 1):
        raise ValueError(f"alpha: must lie in [0, 1], got {alpha!r}")
    smoothed = (1 - alpha) * detach(t) + alpha
    w = suffix_sum(cumprod(smoothed))
    return to_kind(_normalize(w, eps) if normalize else w, kind)  # type: ignore[no-any-return]
