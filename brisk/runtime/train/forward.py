"""The training forward of a run's ``attention`` setting: the model's own attention with the
dense ``[2L, 2L]`` mask, FlexAttention eager (torch's unfused reference: parity, CPU) or compiled
(the fused kernels: CUDA), on plain or packed batches.

It sits above both mask builders, :mod:`brisk.runtime.train.flex` (the ``BlockMask`` twin of the
dense mask) and :mod:`brisk.runtime.train.packing` (packed rows, built on the first).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers import PreTrainedModel

from brisk.runtime.train.fields import ATTENTIONS
from brisk.runtime.train.flex import COMPILED_FLEX, EAGER_FLEX, flex_stream_outputs
from brisk.runtime.train.idlm import idlm_forward
from brisk.runtime.train.packing import PackedBatch, packed_logits

__all__ = ["ATTENTIONS", "set_attention", "training_forward"]


def set_attention(model: PreTrainedModel, attention: str) -> str:
    """Make ``model`` run the training ``attention`` (:data:`ATTENTIONS`) from now on and return
    the attention implementation it had (decoding and evaluation need that one back); a
    compiled flex backward needs CUDA (an error naming the setting otherwise)."""
    before = str(model.config._attn_implementation)
    if attention not in ATTENTIONS:
        raise ValueError(f"attention: expected one of {', '.join(ATTENTIONS)}, got {attention!r}")
    if attention == "flex-compiled" and next(model.parameters()).device.type != "cuda":
        raise ValueError(
            "attention: flex-compiled needs a CUDA device (compiled flex has no CPU backward); "
            "use flex on CPU"
        )
    if attention != "dense":
        model.set_attn_implementation(COMPILED_FLEX if attention == "flex-compiled" else EAGER_FLEX)
    return before


def training_forward(
    net: Any, batch: Any, attention: str, *, hidden: bool = False
) -> tuple[Tensor, Tensor]:
    """Noisy and clean logits ``[B, L, V]`` of ``net`` (a model, or its DDP wrapper, prepared
    with :func:`set_attention`) on an :class:`~brisk.runtime.train.idlm.IDLMBatch` (the dense
    mask, or its ``BlockMask`` twin built here) or a packed batch
    (:class:`~brisk.runtime.train.packing.PackedBatch`: its ``BlockMask``, flex only). Under
    ``flex-compiled`` the sequence length (the row count of a packed batch) is padded to a
    rung of the compiled shapes (:mod:`brisk.runtime.train.flex`) and the padding cut off
    again. With ``hidden`` the streams' last hidden states ``[B, L, H]`` instead (what the
    training loops take: :func:`brisk.runtime.train.vocab.stream_losses` applies the LM head in
    chunks)."""
    if isinstance(batch, PackedBatch):
        if attention == "dense":
            raise ValueError("pack_tokens: packed rows need attention = flex or flex-compiled")
        return packed_logits(net, batch, pad=attention == "flex-compiled", hidden=hidden)
    if attention == "dense":
        return idlm_forward(net, batch, hidden=hidden)
    return flex_stream_outputs(net, batch, pad=attention == "flex-compiled", hidden=hidden)
