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

from typing import Any

import numpy as np
import torch

from brisk.theory._arrays import ArrayInput, Kind, as_tensor, check_finite, to_kind

__all__ = ["break_even_overhead", "tokens_per_second", "wall_clock_speedup"]

Number = ArrayInput | torch.Tensor


def _read(x: Number, name: str, *, positive: bool) -> tuple[torch.Tensor, Kind]:
    t, kind = as_tensor(x, name)
    check_finite(t, name)
    values = t.detach()
    if bool((values <= 0).any() if positive else (values < 0).any()):
        raise ValueError(f"{name}: must be {'> 0' if positive else '≥ 0'}, got {values.min()!r}")
    return t, kind


def _kind(*kinds: Kind) -> Kind:
    return "torch" if "torch" in kinds else "numpy"


def _broadcastable(**named: torch.Tensor) -> None:
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


def tokens_per_second(
    tpf: Number, forward_s: Number, overhead_s: Number = 0.0, concurrency: Number = 1
) -> Any:
    """TPS = concurrency · TPF / (forward_s + overhead_s); broadcasts over its arguments."""
    t, k1 = _read(tpf, "tpf", positive=True)
    f, k2 = _read(forward_s, "forward_s", positive=True)
    o, k3 = _read(overhead_s, "overhead_s", positive=False)
    n, k4 = _read(concurrency, "concurrency", positive=True)
    _broadcastable(tpf=t, forward_s=f, overhead_s=o, concurrency=n)
    return to_kind(n * t / (f + o), _kind(k1, k2, k3, k4))


def wall_clock_speedup(
    tpf_base: Number,
    tpf_new: Number,
    forward_s: Number,
    overhead_s: Number = 0.0,
    base_overhead_s: Number = 0.0,
) -> Any:
    """TPS ratio new/base at equal concurrency: (TPF_new/TPF_base)·(f + o_base)/(f + o_new)."""
    b, k1 = _read(tpf_base, "tpf_base", positive=True)
    n, k2 = _read(tpf_new, "tpf_new", positive=True)
    f, k3 = _read(forward_s, "forward_s", positive=True)
    o, k4 = _read(overhead_s, "overhead_s", positive=False)
    ob, k5 = _read(base_overhead_s, "base_overhead_s", positive=False)
    _broadcastable(tpf_base=b, tpf_new=n, forward_s=f, overhead_s=o, base_overhead_s=ob)
    return to_kind((n / b) * (f + ob) / (f + o), _kind(k1, k2, k3, k4, k5))


def break_even_overhead(
    tpf_base: Number, tpf_new: Number, forward_s: Number, base_overhead_s: Number = 0.0
) -> Any:
    """Added seconds per step at which the new method's TPS falls back to the base's.

    Δo* = (forward_s + base_overhead_s)(TPF_new / TPF_base − 1); negative when TPF_new is
    lower (no overhead budget at all).
    """
    b, k1 = _read(tpf_base, "tpf_base", positive=True)
    n, k2 = _read(tpf_new, "tpf_new", positive=True)
    f, k3 = _read(forward_s, "forward_s", positive=True)
    ob, k4 = _read(base_overhead_s, "base_overhead_s", positive=False)
    _broadcastable(tpf_base=b, tpf_new=n, forward_s=f, base_overhead_s=ob)
    return to_kind((f + ob) * (n / b - 1), _kind(k1, k2, k3, k4))
