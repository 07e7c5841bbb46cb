"""Sequential candidate selection of the corrector: the naive reference, its fused Triton twin
(``fused_recurrent``), and :func:`select`, which picks one.

``impl``: ``"naive"`` always runs the pure-torch loop; ``"triton"`` runs the fused kernel and
raises when it cannot (no Triton, or tensors neither on CUDA nor under ``TRITON_INTERPRET=1``);
``"auto"`` runs the kernel on CUDA tensors when Triton is installed and the naive loop otherwise,
and falls back to the naive loop with a one-time warning naming the reason when the kernel does
not support the inputs (a dtype, a width) or gradients are needed (the kernel has no backward).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import Any, Literal

import torch
from torch import Tensor

from brisk.runtime.kernels.corrector_step.naive import (
    N_FEATURES,
    SelectOutput,
    StepWeights,
    confidence_features,
    corrector_select,
)

__all__ = [
    "IMPLS",
    "N_FEATURES",
    "SelectOutput",
    "StepWeights",
    "confidence_features",
    "corrector_select",
    "need_uniforms",
    "select",
]

Impl = Literal["auto", "naive", "triton"]
IMPLS: tuple[str, ...] = ("auto", "naive", "triton")
_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"corrector: naive selection instead of the fused kernel: {reason}",
            RuntimeWarning,
            stacklevel=3,
        )


@functools.cache  # once per process: select runs every verify round
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _kernel_reason(device: torch.device) -> str | None:
    """Why the fused kernel cannot run on ``device`` here (None: it can)."""
    if not triton_available():
        return "Triton is not installed"
    if device.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return None
    return f"tensors are on {device.type}, not CUDA, and TRITON_INTERPRET=1 is not set"


def need_uniforms(temperature: float, u: Tensor | None) -> None:
    """The one check of a selection's draws: at T > 0 the uniforms ``u [B, M]`` drive them
    (:func:`select` and the CUDA graphs' replay run it; the implementations trust it)."""
    if temperature > 0 and u is None:
        raise ValueError("u: uniforms [B, M] are required when temperature > 0")


def select(
    s0: Tensor,
    mask_x: Tensor,
    anchor_e: Tensor,
    cand_e: Tensor,
    cand_c: Tensor,
    cand_logits: Tensor,
    cand_ids: Tensor,
    anchor_ids: Tensor,
    weights: StepWeights,
    temperature: float,
    u: Tensor | None,
    forced_prev: tuple[Tensor, Tensor] | None = None,
    feedback: bool = True,
    impl: str = "auto",
) -> SelectOutput:
    """:func:`corrector_select` (arguments as there) through the implementation ``impl``."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    need_uniforms(temperature, u)
    args: tuple[Any, ...] = (
        s0,
        mask_x,
        anchor_e,
        cand_e,
        cand_c,
        cand_logits,
        cand_ids,
        anchor_ids,
        weights,
        temperature,
        u,
        forced_prev,
        feedback,
    )
    if impl == "naive":
        return corrector_select(*args)
    device = cand_logits.device
    reason = _kernel_reason(device)
    if impl == "auto" and (reason is not None or device.type != "cuda"):
        return corrector_select(*args)  # the naive loop is the CPU path
    if reason is not None:
        raise ValueError(f"impl: 'triton' cannot run: {reason}")
    from brisk.runtime.kernels.corrector_step.fused_recurrent import (
        corrector_select_fused,
        unsupported,
    )

    why = unsupported(s0, mask_x, cand_e, cand_c, cand_logits, weights)
    if (
        why is None
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (s0, mask_x, anchor_e, cand_e, cand_c, cand_logits))
    ):
        why = "gradients are required (the kernel has no backward)"
    if why is not None:
        _warn_once(why)
        return corrector_select(*args)
    return corrector_select_fused(*args)
