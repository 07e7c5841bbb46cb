"""Renewal-reward tokens per forward.

Paper: the section of fig:tpf_rejection; eq:nonuniform_tpf, eq:idlm_tpf_instantiation.

A verifier checks M parallel proposals left to right; position i is accepted with probability
a_i given that verification reached it. With survival A_k = ∏_{j≤k} a_j (A_0 = 1) the
accepted-prefix length L has

    Pr(L = k) = A_k (1 − a_{k+1})   for 0 ≤ k < M,        Pr(L = M) = A_M,

and a decoder that commits g_k tokens and spends c_k forwards when L = k makes, by the
renewal-reward theorem,

    TPF(a) = Σ_k Pr(L = k) g_k / Σ_k Pr(L = k) c_k,        FPT(a) = 1 / TPF(a).

Shapes: ``a`` is ``[..., M]``; results are batched over the leading dims.

>>> round(float(tpf([0.9] * 7)), 2)  # ISD at N = 8 with 10 % rejection
4.09
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

from brisk.theory._arrays import (
    Array,
    ArrayInput,
    FloatArray,
    Kind,
    as_array,
    check_positions,
    check_probabilities,
    concat,
    cumprod,
    full_like,
    to_kind,
    values_like,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "CostModel",
    "accept_length_pmf",
    "expected_accept_length",
    "fpt",
    "isd_tpf_uniform",
    "speculative_tpf_uniform",
    "survival",
    "tpf",
]


@dataclass(frozen=True)
class CostModel:
    """Tokens committed ``gains[k]`` = g_k and forwards spent ``costs[k]`` = c_k when L = k.

    Both have M + 1 entries (k = 0..M), finite and positive: every verify cycle commits some
    progress (a correction or bonus token at least), so TPF and FPT are finite.

    >>> CostModel.isd(3)
    CostModel(gains=(2.0, 3.0, 4.0, 4.0), costs=(2.0, 2.0, 2.0, 1.0))
    """

    gains: tuple[float, ...]
    costs: tuple[float, ...]

    def __post_init__(self) -> None:
        gains = tuple(float(g) for g in self.gains)
        costs = tuple(float(c) for c in self.costs)
        if len(gains) < 2:
            raise ValueError(f"gains: need M + 1 ≥ 2 entries (k = 0..M), got {len(gains)}")
        if len(costs) != len(gains):
            raise ValueError(
                f"costs: need one entry per k = 0..M like gains ({len(gains)}), got {len(costs)}"
            )
        for name, values in (("gains", gains), ("costs", costs)):
            for k, v in enumerate(values):
                if not math.isfinite(v):
                    raise ValueError(f"{name}: entry k = {k} is not finite ({v!r})")
        for name, values in (("gains", gains), ("costs", costs)):
            for k, v in enumerate(values):
                if v <= 0:
                    raise ValueError(f"{name}: entry k = {k} must be positive, got {v!r}")
        object.__setattr__(self, "gains", gains)
        object.__setattr__(self, "costs", costs)

    @property
    def M(self) -> int:
        """Number of proposal positions."""
        return len(self.gains) - 1

    @classmethod
    def isd(cls, M: int) -> CostModel:
        """Introspective strided decoding at stride N = M + 1 (paper, eq:idlm_tpf_instantiation).

        g_k = 2 + min(k, M − 1); c_k = 2 for k < M and c_M = 1: a full pass commits the M
        specs plus the bonus token and reuses the MASK proposals, a rejection commits the
        accepted specs plus the correction and pays a cold-start forward.
        """
        _check_M(M)
        return cls(
            gains=tuple(2.0 + min(k, M - 1) for k in range(M + 1)),
            costs=tuple(2.0 if k < M else 1.0 for k in range(M + 1)),
        )

    @classmethod
    def speculative(cls, M: int, draft_cost: float = 0.0) -> CostModel:
        """Speculative decoding with an external verifier: g_k = k + 1, c_k = 1 + draft_cost.

        ``draft_cost`` is the drafter's forward time relative to the verifier's (0 ignores it).
        """
        _check_M(M)
        if not (math.isfinite(draft_cost) and draft_cost >= 0):
            raise ValueError(f"draft_cost: must be finite and ≥ 0, got {draft_cost!r}")
        return cls(
            gains=tuple(float(k + 1) for k in range(M + 1)),
            costs=tuple(1.0 + draft_cost for _ in range(M + 1)),
        )

    def tensors(self, like: Array) -> tuple[Array, Array]:
        """(g, c) as ``[M + 1]`` arrays of ``like``'s kind, dtype and device."""
        return values_like(self.gains, like), values_like(self.costs, like)


def _check_M(M: int) -> None:
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ValueError(f"M: need an integer number of proposal positions ≥ 1, got {M!r}")


def resolve_cost(cost: CostModel | None, M: int) -> CostModel:
    """``cost``, or ISD at the same M when None; a cost model of another M is an error."""
    if cost is None:
        return CostModel.isd(M)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost: expected a CostModel or None, got {type(cost).__name__}")
    if cost.M != M:
        raise ValueError(f"cost: cost model has M = {cost.M} but a has M = {M} positions")
    return cost


def read_profile(a: ArrayInput | torch.Tensor, name: str = "a") -> tuple[Array, Kind]:
    """Validate an acceptance profile ``[..., M]``; returns the array and the caller's kind."""
    t, kind = as_array(a, name)
    check_positions(t, name)
    check_probabilities(t, name)
    return t, kind


def _survival(a: Array) -> Array:
    return concat([full_like(a, (*a.shape[:-1], 1), 1.0), cumprod(a)])


def _pmf(a: Array) -> Array:
    A = _survival(a)
    return concat([A[..., :-1] * (1 - a), A[..., -1:]])


def _tpf(a: Array, cost: CostModel) -> Array:
    g, c = cost.tensors(a)
    pmf = _pmf(a)
    return (pmf * g).sum(-1) / (pmf * c).sum(-1)


@overload
def survival(a: torch.Tensor) -> torch.Tensor: ...
@overload
def survival(a: ArrayInput) -> FloatArray: ...
def survival(a: ArrayInput | torch.Tensor) -> FloatArray | torch.Tensor:
    """Survival A_k = ∏_{j≤k} a_j for k = 0..M (A_0 = 1). a: ``[..., M]`` → ``[..., M+1]``."""
    t, kind = read_profile(a)
    return to_kind(_survival(t), kind)  # type: ignore[no-any-return]


@overload
def accept_length_pmf(a: torch.Tensor) -> torch.Tensor: ...
@overload
def accept_length_pmf(a: ArrayInput) -> FloatArray: ...
def accept_length_pmf(a: ArrayInput | torch.Tensor) -> FloatArray | torch.Tensor:
    """Pr(L = k) = A_k (1 − a_{k+1}) for k < M, A_M for k = M (paper, eq:nonuniform_tpf).

    a: ``[..., M]`` → ``[..., M+1]``.
    """
    t, kind = read_profile(a)
    return to_kind(_pmf(t), kind)  # type: ignore[no-any-return]


@overload
def expected_accept_length(a: torch.Tensor) -> torch.Tensor: ...
@overload
def expected_accept_length(a: ArrayInput) -> FloatArray: ...
def expected_accept_length(a: ArrayInput | torch.Tensor) -> FloatArray | torch.Tensor:
    """E[L] = Σ_{k=1}^{M} A_k (paper, the section of fig:tpf_rejection).

    a: ``[..., M]`` → ``[...]``."""
    t, kind = read_profile(a)
    return to_kind(_survival(t)[..., 1:].sum(-1), kind)  # type: ignore[no-any-return]


@overload
def tpf(a: torch.Tensor, cost: CostModel | None = None) -> torch.Tensor: ...
@overload
def tpf(a: ArrayInput, cost: CostModel | None = None) -> FloatArray: ...
def tpf(a: ArrayInput | torch.Tensor, cost: CostModel | None = None) -> FloatArray | torch.Tensor:
    """Tokens per forward Σ Pr(L=k) g_k / Σ Pr(L=k) c_k (paper, eq:nonuniform_tpf).

    a: ``[..., M]`` → ``[...]``.

    ``cost=None`` means ISD at stride N = M + 1 (:meth:`CostModel.isd`), where this equals
    (2 + Σ_{k=1}^{M−1} A_k) / (2 − A_M) (paper, eq:idlm_tpf_instantiation).
    """
    t, kind = read_profile(a)
    return to_kind(_tpf(t, resolve_cost(cost, t.shape[-1])), kind)  # type: ignore[no-any-return]


@overload
def fpt(a: torch.Tensor, cost: CostModel | None = None) -> torch.Tensor: ...
@overload
def fpt(a: ArrayInput, cost: CostModel | None = None) -> FloatArray: ...
def fpt(a: ArrayInput | torch.Tensor, cost: CostModel | None = None) -> FloatArray | torch.Tensor:
    """Forwards per token FPT = 1 / TPF (eq:nonuniform_tpf). a: ``[..., M]`` → ``[...]``."""
    t, kind = read_profile(a)
    return to_kind(1 / _tpf(t, resolve_cost(cost, t.shape[-1])), kind)  # type: ignore[no-any-return]


def _geometric(x: Array, lo: int, hi: int) -> Array:
    """Σ_{i=lo}^{hi} x^i by Horner's rule: exact at x = 1, no 1/(1 − x) cancellation."""
    total = x * 0
    for _ in range(hi - lo + 1):
        total = total * x + 1
    return total * x**lo


@overload
def isd_tpf_uniform(r: torch.Tensor, stride: int) -> torch.Tensor: ...
@overload
def isd_tpf_uniform(r: ArrayInput, stride: int) -> FloatArray: ...
def isd_tpf_uniform(r: ArrayInput | torch.Tensor, stride: int) -> FloatArray | torch.Tensor:
    """ISD tokens per forward at uniform rejection rate r and stride N.

    The display in the paper's section of fig:tpf_rejection (it has no label; that figure plots
    it), the uniform case a_i = 1 − r of eq:idlm_tpf_instantiation:

        TPF_N(r) = (2 + Σ_{i=1}^{N−2} (1 − r)^i) / (2 − (1 − r)^{N−1})

    r: any shape, values in [0, 1]; ``stride`` N ≥ 2.

    >>> [round(float(isd_tpf_uniform(r, 8)), 2) for r in (0.0, 0.10, 0.15, 0.20)]
    [8.0, 4.09, 3.29, 2.77]
    """
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 2:
        raise ValueError(f"stride: need an integer stride N ≥ 2, got {stride!r}")
    t, kind = as_array(r, "r")
    check_probabilities(t, "r")
    a = 1 - t
    numerator = 2 + (_geometric(a, 1, stride - 2) if stride > 2 else a * 0)
    return to_kind(numerator / (2 - a ** (stride - 1)), kind)  # type: ignore[no-any-return]


@overload
def speculative_tpf_uniform(alpha: torch.Tensor, M: int) -> torch.Tensor: ...
@overload
def speculative_tpf_uniform(alpha: ArrayInput, M: int) -> FloatArray: ...
def speculative_tpf_uniform(alpha: ArrayInput | torch.Tensor, M: int) -> FloatArray | torch.Tensor:
    """Speculative decoding at uniform acceptance α: (1 − α^{M+1}) / (1 − α), = M + 1 at α = 1.

    Evaluated as Σ_{k=0}^{M} α^k, which is exact at α = 1. alpha: any shape, values in [0, 1].
    """
    _check_M(M)
    t, kind = as_array(alpha, "alpha")
    check_probabilities(t, "alpha")
    return to_kind(_geometric(t, 0, M), kind)  # type: ignore[no-any-return]
