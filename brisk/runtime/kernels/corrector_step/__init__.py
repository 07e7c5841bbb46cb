"""Sequential candidate selection of the corrector: the naive reference, its fused Triton twin
(``fused_recurrent``), and :func:`select`, which picks one. Both take one :class:`StepInputs`;
:class:`CorrectorInputs` is the head's own input, one level up (the raw proposal block).

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
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from brisk.runtime.decode_options import IMPLS
from brisk.runtime.kernels.corrector_step.naive import (
    N_FEATURES,
    SelectOutput,
    StepInputs,
    StepWeights,
    confidence_features,
    corrector_select,
)

__all__ = [
    "IMPLS",
    "N_FEATURES",
    "CorrectorInputs",
    "SelectOutput",
    "StepInputs",
    "StepWeights",
    "confidence_features",
    "corrector_select",
    "need_uniforms",
    "select",
]

_warned: set[str] = set()


@dataclass(frozen=True)
class CorrectorInputs:
    """One proposal block as the corrector head reads it (``Corrector.forward`` and
    ``Corrector.select``, and the CUDA-graph replay's static buffers): the backbone's hidden
    states and the Top-K candidates of its base proposal q, before any projection. Defined here,
    below the module layer, so that the replay can build one; :mod:`brisk.runtime.corrector`
    exports it."""

    anchor_hidden: Tensor  # [B, H]     h_c, hidden state of the slot that produced x_0
    anchor_ids: Tensor  # [B]           x_0
    mask_hidden: Tensor  # [B, M, H]    m_j, hidden states of the M MASK slots
    cand_logits: Tensor  # [B, M, K]    base logits ℓ_j(c_k), descending (what topk returns)
    cand_ids: Tensor  # [B, M, K]       C_j = TopK(q_j)
    u: Tensor | None = None  # [B, M]   uniforms that drive the draw at T > 0 (required there)

    def tensors(self) -> dict[str, Tensor]:
        """The tensors given, by field name (``u`` only when set)."""
        named = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: t for name, t in named.items() if t is not None}


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
    inputs: StepInputs,
    weights: StepWeights,
    temperature: float,
    feedback: bool = True,
    impl: str = "auto",
) -> SelectOutput:
    """:func:`corrector_select` (arguments as there) through the implementation ``impl``."""
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    need_uniforms(temperature, inputs.u)
    if impl == "naive":
        return corrector_select(inputs, weights, temperature, feedback)
    device = inputs.cand_logits.device
    reason = _kernel_reason(device)
    if impl == "auto" and (reason is not None or device.type != "cuda"):
        return corrector_select(inputs, weights, temperature, feedback)  # the CPU path
    if reason is not None:
        raise ValueError(f"impl: 'triton' cannot run: {reason}")
    from brisk.runtime.kernels.corrector_step.fused_recurrent import (
        corrector_select_fused,
        unsupported,
    )

    why = unsupported(inputs, weights)
    if why is None and torch.is_grad_enabled() and inputs.requires_grad:
        why = "gradients are required (the kernel has no backward)"
    if why is not None:
        _warn_once(why)
        return corrector_select(inputs, weights, temperature, feedback)
    return corrector_select_fused(inputs, weights, temperature, feedback)
