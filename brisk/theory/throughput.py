"""From tokens per forward to tokens per second: the step-time model.

A decoding step runs one batched forward (``forward_s``) plus whatever the method adds around
it (``overhead_s``: a corrector head, sampling, scheduling). With ``concurrency`` requests in the
batch,

    TPS = concurrency · TPF / (forward_s + overhead_s).

So a TPF gain pays for itself only while the added per-step time stays below

    Δo* = (forward_s + base_overhead_s) · (TPF_new / TPF_base − 1),

and the wall-clock speedup, (TPF_new / TPF_base) · (f + o_base) / (f + o_new), is smaller than
the TPF ratio whenever the new method adds any time (the paper's point that TPF gains exceed
wall-clock gains).

>>> round(float(wall_clock_speedup(4.0, 5.0, forward_s=0.030, overhead_s=0.002)), 3)
1.172
>>> round(float(break_even_overhead(4.0, 5.0, forward_s=0.030)), 4)  # seconds per step
0.0075
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from brisk.theory._arrays import Array, ArrayInput, Kind, as_array, check_finite, detach, to_kind

if TYPE_CHECKING:
    import torch

__all__ = ["break_even_overhead", "tokens_per_second", "wall_clock_speedup"]

Number: TypeAlias = "ArrayInput | torch.Tensor"


_MAY_BE_ZERO = frozenset({"overhead_s", "base_overhead_s"})
"""Inputs that may be 0 (a method that adds no time per step); every other one must be > 0."""


def _read(x: Number, name: str) -> tuple[Array, Kind]:
    t, kind = as_array(x, name)
    check_finite(t, name)
    values = detach(t)
    positive = name not in _MAY_BE_ZERO
    if bool((values <= 0).any() if positive else (values < 0).any()):
        raise ValueError(
            f"{name}: must be {'> 0' if positive else '≥ 0'}, got {float(values.min())!r}"
        )
    return t, kind


def _common(*read: tuple[Array, Kind]) -> tuple[list[Array], Kind]:
    """The arrays in one kind: torch if any argument is a tensor (numpy ones join as CPU
    tensors), numpy otherwise."""
    arrays = [x for x, _ in read]
    if all(kind == "numpy" for _, kind in read):
        return arrays, "numpy"
    return [to_kind(x, "torch") for x in arrays], "torch"


def _broadcastable(**named: Array) -> None:
    """Shapes must broadcast together; the error names the first argument that does not."""
    shape: tuple[int, ...] = ()
    for name, t in named.items():
        try:
            shape = np.broadcast_shapes(shape, tuple(t.shape))
        except ValueError:
            others = ", ".join(n for n in named if n != name)
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not broadcast with {others} {shape}"
            ) from None


def _read_all(**named: Number) -> tuple[list[Array], Kind]:
    """The named inputs checked (:func:`_read`), in one kind (:func:`_common`), with shapes
    that broadcast together."""
    arrays, kind = _common(*(_read(x, name) for name, x in named.items()))
    _broadcastable(**dict(zip(named, arrays, strict=True)))
    return arrays, kind


def tokens_per_second(
    tpf: Number, forward_s: Number, overhead_s: Number = 0.0, concurrency: Number = 1
) -> Any:
    """TPS = concurrency · TPF / (forward_s + overhead_s); broadcasts over its arguments."""
    (t, f, o, n), kind = _read_all(
        tpf=tpf, forward_s=forward_s, overhead_s=overhead_s, concurrency=concurrency
    )
    return to_kind(n * t / (f + o), kind)


def wall_clock_speedup(
    tpf_base: Number,
    tpf_new: Number,
    forward_s: Number,
    overhead_s: Number = 0.0,
    base_overhead_s: Number = 0.0,
) -> Any:
    """TPS ratio new/base at equal concurrency: (TPF_new/TPF_base)·(f + o_base)/(f + o_new)."""
    (b, n, f, o, ob), kind = _read_all(
        tpf_base=tpf_base,
        tpf_new=tpf_new,
        forward_s=forward_s,
        overhead_s=overhead_s,
        base_overhead_s=base_overhead_s,
    )
    return to_kind((n / b) * (f + ob) / (f + o), kind)


def break_even_overhead(
    tpf_base: Number, tpf_new: Number, forward_s: Number, base_overhead_s: Number = 0.0
) -> Any:
    """Added seconds per step at which the new method's TPS falls back to the base's.

    Δo* = (forward_s + base_overhead_s)(TPF_new / TPF_base − 1); negative when TPF_new is
    lower (no overhead budget at all).
    """
    (b, n, f, ob), kind = _read_all(
        tpf_base=tpf_base, tpf_new=tpf_new, forward_s=forward_s, base_overhead_s=base_overhead_s
    )
    return to_kind((f + ob) * (n / b - 1), kind)
