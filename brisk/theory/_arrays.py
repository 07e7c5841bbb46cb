"""Input handling shared by the theory functions.

Every public theory function accepts Python sequences, numpy arrays or torch tensors and
returns the input's kind: numpy in → numpy out, torch in → torch out with autograd intact.
The math runs in the input's own library: numpy for sequences and numpy arrays, torch for
tensors. torch is never imported here: a tensor can only exist once the caller has imported
torch, so :func:`is_tensor` looks it up in ``sys.modules``, and ``import brisk.theory`` stays
cheap (no torch at start-up). Integer and boolean inputs are promoted to float64, floating
inputs keep their dtype.

The few operations whose spelling differs between numpy and torch (concatenation, cumulative
products and sums, flips, new arrays of a given dtype and device) are the small functions
below; everything else is written with operators both libraries share.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from typing import TypeGuard

    import torch

ArrayInput: TypeAlias = npt.NDArray[Any] | Sequence[Any] | float
"""Anything numpy can read as a real array (lists, tuples, numpy arrays, Python floats)."""

FloatArray: TypeAlias = npt.NDArray[np.floating[Any]]
Kind: TypeAlias = Literal["numpy", "torch"]

Array: TypeAlias = Any
"""A floating numpy array (or numpy scalar) or a torch tensor: the caller's kind, in use."""


def is_tensor(x: object) -> TypeGuard[torch.Tensor]:
    """Whether ``x`` is a torch tensor, without importing torch."""
    torch_module = sys.modules.get("torch")
    tensor_type = getattr(torch_module, "Tensor", None)
    return tensor_type is not None and isinstance(x, tensor_type)


def as_array(x: ArrayInput | torch.Tensor, name: str) -> tuple[Array, Kind]:
    """Read ``x`` as a real floating array, remembering which kind to hand back."""
    if is_tensor(x):
        if x.is_complex():
            raise ValueError(f"{name}: expected real numbers, got dtype {x.dtype}")
        return (x if x.is_floating_point() else x.double()), "torch"
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: cannot be read as a numeric array ({err})") from None
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind != "f":
        raise ValueError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    return np.require(arr, dtype=arr.dtype.newbyteorder("="), requirements="C"), "numpy"


def to_kind(x: Array, kind: Kind) -> Any:
    """Hand ``x`` back in the caller's kind (0-d numpy results become numpy scalars).

    A numpy result for a torch caller (code that runs in numpy whatever the input, such as
    a simulation) becomes a CPU tensor.
    """
    if kind == "torch":
        if is_tensor(x):
            return x
        import torch

        return torch.from_numpy(np.array(x))
    out = np.asarray(x.detach().cpu().numpy() if is_tensor(x) else x)
    return out[()] if out.ndim == 0 else out


def to_numpy(x: Array) -> npt.NDArray[Any]:
    """A numpy copy or view of ``x`` with no autograd history (for checks and simulation)."""
    return np.asarray(x.detach().cpu().numpy() if is_tensor(x) else x)


def detach(x: Array) -> Array:
    """``x`` without autograd history (numpy arrays have none)."""
    return x.detach() if is_tensor(x) else x


def concat(xs: Sequence[Array], axis: int = -1) -> Array:
    """Concatenate along ``axis`` (``torch.cat`` / ``np.concatenate``)."""
    if is_tensor(xs[0]):
        import torch

        return torch.cat(list(xs), dim=axis)
    return np.concatenate(xs, axis=axis)


def stack(xs: Sequence[Array], axis: int = -1) -> Array:
    """Stack equal-shaped arrays along a new ``axis`` (``torch.stack`` / ``np.stack``)."""
    if is_tensor(xs[0]):
        import torch

        return torch.stack(list(xs), dim=axis)
    return np.stack(xs, axis=axis)


def cumprod(x: Array, axis: int = -1) -> Array:
    """Running product along ``axis``."""
    return x.cumprod(dim=axis) if is_tensor(x) else np.cumprod(x, axis=axis)


def cumsum(x: Array, axis: int = -1) -> Array:
    """Running sum along ``axis``."""
    return x.cumsum(dim=axis) if is_tensor(x) else np.cumsum(x, axis=axis)


def flip(x: Array, axis: int = -1) -> Array:
    """Reverse the order along ``axis``."""
    return x.flip(axis) if is_tensor(x) else np.flip(x, axis=axis)


def suffix_sum(x: Array, axis: int = -1) -> Array:
    """Σ_{k≥i} x_k along ``axis``."""
    return flip(cumsum(flip(x, axis), axis), axis)


def full_like(x: Array, shape: tuple[int, ...], value: float) -> Array:
    """A new array of ``shape`` filled with ``value``, with ``x``'s dtype and device."""
    if is_tensor(x):
        return x.new_full(shape, value)
    return np.full(shape, value, dtype=np.asarray(x).dtype)


def values_like(values: Sequence[float] | npt.NDArray[Any], x: Array) -> Array:
    """A 1-d array of ``values`` with ``x``'s dtype and device."""
    if is_tensor(x):
        return x.new_tensor(values)
    return np.asarray(values, dtype=np.asarray(x).dtype)


def check_positions(t: Array, name: str) -> int:
    """Require a trailing axis of M ≥ 1 proposal positions; return M."""
    if t.ndim == 0:
        raise ValueError(f"{name}: expected shape [..., M] with M ≥ 1 positions, got a scalar")
    if t.shape[-1] == 0:
        raise ValueError(
            f"{name}: expected M ≥ 1 proposal positions, got shape {tuple(t.shape)} (M = 0)"
        )
    return int(t.shape[-1])


def _first_bad(values: Array, ok: Array) -> tuple[tuple[int, ...], float]:
    """Index and value of the first entry where ``ok`` is false."""
    bad = np.argwhere(~to_numpy(ok))
    index = tuple(int(i) for i in bad[0]) if bad.size else ()
    return index, float(to_numpy(values)[index])


def check_probabilities(t: Array, name: str) -> None:
    """Require every entry of ``t`` to lie in [0, 1]; NaN is rejected too."""
    values = detach(t)
    ok = (values >= 0) & (values <= 1)
    if bool(ok.all()):
        return
    index, bad = _first_bad(values, ok)
    found = "NaN" if math.isnan(bad) else repr(bad)
    where = f" at index {index}" if index else ""
    raise ValueError(f"{name}: probabilities must lie in [0, 1]; found {found}{where}")


def check_finite(t: Array, name: str) -> None:
    """Require every entry of ``t`` to be finite."""
    values = detach(t)
    finite = values.isfinite() if is_tensor(values) else np.isfinite(values)
    if bool(finite.all()):
        return
    index, bad = _first_bad(values, finite)
    where = f" at index {index}" if index else ""
    raise ValueError(f"{name}: values must be finite; found {bad!r}{where}")
