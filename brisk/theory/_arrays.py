"""Input handling shared by the theory functions.

Every public theory function accepts Python sequences, numpy arrays or torch tensors and
returns the input's kind: numpy in → numpy out, torch in → torch out with autograd intact.
The math runs in torch either way (``torch.from_numpy`` shares memory, so numpy inputs are
not copied); integer and boolean inputs are promoted to float64, floating inputs keep their
dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import torch

ArrayInput: TypeAlias = npt.NDArray[Any] | Sequence[Any] | float
"""Anything numpy can read as a real array (lists, tuples, numpy arrays, Python floats)."""

FloatArray: TypeAlias = npt.NDArray[np.floating[Any]]
Kind: TypeAlias = Literal["numpy", "torch"]


def as_tensor(x: ArrayInput | torch.Tensor, name: str) -> tuple[torch.Tensor, Kind]:
    """Read ``x`` as a real floating tensor, remembering which kind to hand back."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise ValueError(f"{name}: expected real numbers, got dtype {x.dtype}")
        return (x if x.is_floating_point() else x.to(torch.float64)), "torch"
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: cannot be read as a numeric array ({err})") from None
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind != "f":
        raise ValueError(f"{name}: expected real numbers, got dtype {arr.dtype}")
    arr = np.require(arr, dtype=arr.dtype.newbyteorder("="), requirements="C")
    return torch.from_numpy(arr), "numpy"


def to_kind(t: torch.Tensor, kind: Kind) -> Any:
    """Hand ``t`` back in the caller's kind (0-d numpy results become numpy scalars)."""
    if kind == "torch":
        return t
    out = t.detach().numpy()
    return out[()] if out.ndim == 0 else out


def check_positions(t: torch.Tensor, name: str) -> int:
    """Require a trailing axis of M ≥ 1 proposal positions; return M."""
    if t.ndim == 0:
        raise ValueError(f"{name}: expected shape [..., M] with M ≥ 1 positions, got a scalar")
    if t.shape[-1] == 0:
        raise ValueError(
            f"{name}: expected M ≥ 1 proposal positions, got shape {tuple(t.shape)} (M = 0)"
        )
    return int(t.shape[-1])


def check_probabilities(t: torch.Tensor, name: str) -> None:
    """Require every entry of ``t`` to lie in [0, 1]; NaN is rejected too."""
    values = t.detach()
    ok = (values >= 0) & (values <= 1)
    if bool(ok.all()):
        return
    index = tuple(int(i) for i in (~ok).nonzero()[0].tolist())
    bad = float(values[index]) if index else float(values)
    found = "NaN" if math.isnan(bad) else repr(bad)
    where = f" at index {index}" if index else ""
    raise ValueError(f"{name}: probabilities must lie in [0, 1]; found {found}{where}")


def check_finite(t: torch.Tensor, name: str) -> None:
    """Require every entry of ``t`` to be finite."""
    finite = torch.isfinite(t.detach())
    if bool(finite.all()):
        return
    index = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
    bad = float(t.detach()[index]) if index else float(t.detach())
    where = f" at index {index}" if index else ""
    raise ValueError(f"{name}: values must be finite; found {bad!r}{where}")
