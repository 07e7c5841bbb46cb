"""The I-DLM training mask as a FlexAttention ``BlockMask``: the dense mask's sparse twin.

The sequence fed to the model is ``[x_t | x_0]`` of length 2L; index ``i`` belongs to the noisy
stream iff ``i < L`` and sits at position ``p(i)`` (``i mod L`` for a plain batch, the
in-example position for a packed row), in document ``d(i)`` (the example it belongs to). With
``blk(p) = ⌊(p − o)/M⌋`` the mask is

    allowed(q, k) = may_attend(noisy(q), p(q), noisy(k), p(k); M, o)  ∧  d(q) = d(k)

where ``may_attend`` (:func:`brisk.runtime.train.idlm.may_attend`) is the rule table

    noisy q → noisy k   iff blk(p(k)) = blk(p(q)) and p(k) ≤ p(q)
    noisy q → clean k   iff blk(p(k)) < blk(p(q))
    clean q → clean k   iff p(k) ≤ p(q)

— the very predicate :func:`~brisk.runtime.train.idlm.block_diffusion_mask` evaluates densely,
so the two masks cannot disagree. Without documents the second factor is dropped.

:func:`idlm_block_mask` evaluates the ``mask_mod`` one stripe of query tiles at a time and keeps
only the per-tile verdicts (empty / partial / full for each ``BLOCK × BLOCK`` tile), so no
``[2L, 2L]`` tensor exists on this path: memory is ``O(stripe · 2L)`` while building and
``O((2L/BLOCK)²)`` after. :func:`flex_forward` runs a Hugging Face model with that mask through
transformers' attention interface (:mod:`brisk.runtime.train.forward` chooses between the dense
mask, this one and packed rows for a training run):

- ``compile=True``: ``"brisk_flex_compiled"``, ``torch.compile(flex_attention,
  dynamic=False)`` (the fused Triton kernels on CUDA; inductor's C++ template on CPU, forward
  only). Not transformers' own ``"flex_attention"``: it compiles with automatic dynamic
  shapes, and on torch 2.11 + CUDA the packed mask, compiled after other lengths had been,
  failed to lower (``NoValidChoicesError``). Static shapes compile once per shape, so what
  varies from batch to batch must not be a shape or a Python constant:

  * ``M`` and the offset are 0-d tensors the ``mask_mod`` captures (dynamo passes captured
    tensors to the graph as inputs; a captured ``int`` would be a guard, one graph per value);
  * ``L`` is padded up to a rung of :func:`padded_length`'s ladder, so a run compiles once per
    rung it visits (and per grad mode: the no-grad probes and evaluation are graphs of their
    own), not once per batch. Each stream is padded at its end, ``[x_t, pad | x_0, pad]``,
    with positions ``L..Lp−1``: the rule table of the padded length then holds unchanged, and
    as every rule needs ``p(k) ≤ p(q)`` (or an earlier block) no real query (``p < L``) sees a
    padding key, so the real positions' logits are those of the unpadded batch; only they are
    projected onto the vocabulary (``logits_to_keep``). Packed rows have a fixed length (the
    budget); their count is padded to a rung of :func:`bucket` with rows of padding, a
    document (−1) of their own;
  * the calls run under a recompile limit above dynamo's default 8, which the rungs × grad
    modes of one run can exceed: past the limit dynamo silently runs flex uncompiled, which
    materializes the ``[B, H, 2L, 2L]`` scores;
- ``compile=False``: ``"brisk_flex_eager"``, ``flex_attention`` without compilation (torch's
  unfused reference, which materializes the ``[B, H, 2L, 2L]`` scores: for parity, not speed).

torch's public ``flex_attention`` refuses inputs that require grad on CPU (eager or compiled).
For CPU tests and the CPU benchmark the eager backend then calls the higher-order op underneath
it directly, whose eager autograd is torch's dense math forward/backward with the same block
mask and ``mask_mod`` (a private torch API; only this CPU-with-grad case uses it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache, partial
from typing import Any

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_mask, flex_attention
from transformers import AttentionInterface, PreTrainedModel

from brisk.runtime.train.idlm import IDLMBatch, may_attend, stream_outputs

__all__ = [
    "COMPILED_FLEX",
    "EAGER_FLEX",
    "MaskMod",
    "batch_offset",
    "bucket",
    "flex_forward",
    "flex_idlm_forward",
    "flex_stream_outputs",
    "idlm_block_mask",
    "idlm_mask_mod",
    "pad_streams",
    "padded_length",
    "use_flex",
]

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
EAGER_FLEX = "brisk_flex_eager"
COMPILED_FLEX = "brisk_flex_compiled"
BLOCK = 128  # FlexAttention's default sparse block size
_STRIPE_ELEMENTS = 1 << 24  # bools evaluated per stripe while building a BlockMask
# graphs the compiled flex may hold: rungs visited × 2 grad modes × packed or not, with room
_RECOMPILE_LIMIT = 64


def bucket(n: int) -> int:
    """The smallest rung ``≥ n`` of the ladder ``1, 2, 3, 4, 6, 8, 12, 16, …`` (``2^k`` and
    ``3·2^(k−1)``): from 2 on a rung is at most 1.5 times the one below, so padding up to it
    adds under a third of the padded size, and the sizes ``1..2^k`` fall on ``2k`` rungs.

    >>> [bucket(n) for n in (1, 2, 3, 5, 7, 9, 13, 17, 25, 100)]
    [1, 2, 3, 6, 8, 12, 16, 24, 32, 128]
    """
    if n < 1:
        raise ValueError(f"n: expected ≥ 1, got {n}")
    power = 1 << (n - 1).bit_length()  # the smallest 2^k ≥ n
    return 3 * power // 4 if power >= 4 and n <= 3 * power // 4 else power


def padded_length(L: int, block: int = BLOCK) -> int:
    """``Lp = block · bucket(⌈L / block⌉)``: the stream length compiled flex runs at.

    >>> [padded_length(L) for L in (1, 128, 129, 300, 400, 513, 2048)]
    [128, 128, 256, 384, 512, 768, 2048]
    """
    return block * bucket(-(-L // block))


def idlm_mask_mod(
    L: int,
    M: int,
    offset: int = 0,
    positions: Tensor | None = None,
    docs: Tensor | None = None,
    device: torch.device | str | None = None,
) -> MaskMod:
    """``mask_mod(b, h, q_idx, kv_idx)`` of the module docstring over a sequence of length 2L.

    ``positions [B, 2L]`` gives ``p(i)`` per row (default ``i mod L``); ``docs [B, 2L]`` the
    document of every index (default: one document). ``b`` indexes both tables, so a mask
    built with ``B = None`` (broadcast) needs neither or tables with one row. ``M`` and
    ``offset`` are captured as 0-d tensors on ``device`` (default: the tables', else the CPU),
    so that compiled flex takes them as inputs instead of compiling once per value; ``L`` is a
    shape and stays an ``int``.
    """
    if M < 1:
        raise ValueError(f"M: block size must be ≥ 1, got {M}")
    if device is None:
        device = next((t.device for t in (positions, docs) if t is not None), "cpu")
    block_size, start = torch.tensor(M, device=device), torch.tensor(offset, device=device)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if positions is None:
            q_pos, kv_pos = q_idx % L, kv_idx % L
        else:
            q_pos, kv_pos = positions[b, q_idx], positions[b, kv_idx]
        allowed = may_attend(q_idx < L, q_pos, kv_idx < L, kv_pos, block_size, start)
        if docs is None:
            return allowed
        return allowed & (docs[b, q_idx] == docs[b, kv_idx])

    return mask_mod


def _tile_verdicts(
    mask_mod: MaskMod, B: int, n: int, block: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``(any, all)`` of the mask over every ``block × block`` tile, each ``[B, nb, nb]``, from
    stripes of whole query tiles; indices past ``n`` count as masked (as in torch)."""
    nb = -(-n // block)
    rows = max(1, _STRIPE_ELEMENTS // (B * nb * block * block)) * block
    any_parts, all_parts = [], []
    for q0 in range(0, nb * block, rows):
        q_len = min(rows, nb * block - q0)

        def stripe_mod(b: Tensor, h: Tensor, q: Tensor, k: Tensor, q0: int = q0) -> Tensor:
            q_abs = q + q0
            inside = (q_abs < n) & (k < n)
            return inside & mask_mod(b, h, q_abs.clamp(max=n - 1), k.clamp(max=n - 1))

        dense = create_mask(stripe_mod, B, 1, q_len, nb * block, device=device)
        tiles = dense[:, 0].view(B, q_len // block, block, nb, block).transpose(2, 3)
        any_parts.append(tiles.any(-1).any(-1))
        all_parts.append(tiles.all(-1).all(-1))
    return torch.cat(any_parts, 1), torch.cat(all_parts, 1)


def _ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """``[B, nb, nb]`` bool → FlexAttention's ``(num_blocks [B, 1, nb], indices [B, 1, nb, nb])``:
    the set tiles of each query row first, in ascending key order."""
    num = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True)
    return num[:, None], order.to(torch.int32)[:, None]


def idlm_block_mask(
    L: int,
    M: int,
    offset: int = 0,
    *,
    positions: Tensor | None = None,
    docs: Tensor | None = None,
    device: torch.device | str = "cpu",
    block: int = BLOCK,
) -> BlockMask:
    """The I-DLM mask of a ``2L`` sequence as a ``BlockMask`` (batch ``B`` = rows of
    ``positions``/``docs``, or broadcast when both are ``None``), built tile by tile: no
    ``[2L, 2L]`` tensor is materialized. Equals ``create_block_mask(idlm_mask_mod(...))``."""
    dev = torch.device(device)
    tables = [t for t in (positions, docs) if t is not None]
    B = tables[0].shape[0] if tables else 1
    for t in tables:
        if t.shape != (B, 2 * L):
            raise ValueError(f"positions/docs: expected shape ({B}, {2 * L}), got {tuple(t.shape)}")
    mask_mod = idlm_mask_mod(
        L,
        M,
        offset,
        positions.to(dev) if positions is not None else None,
        docs.to(dev) if docs is not None else None,
        dev,
    )
    some, full = _tile_verdicts(mask_mod, B, 2 * L, block, dev)
    kv_num, kv_idx = _ordered(some & ~full)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=mask_mod,
        seq_lengths=(2 * L, 2 * L),
    )


def _flex_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: BlockMask | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    compiled: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers attention backend: ``flex_attention`` (compiled or not) with a ``BlockMask``.
    ``query [B, Hq, S, D]``, ``key/value [B, Hkv, S, D]`` → ``[B, S, Hq, D]``."""
    if dropout > 0:
        raise ValueError("dropout: flex attention here has none; set attention_dropout = 0")
    if not isinstance(attention_mask, BlockMask):
        raise TypeError(f"attention_mask: flex attention needs a BlockMask, got {attention_mask!r}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if compiled:
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            out = _compiled_flex()(
                query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=True
            )
    elif query.device.type == "cpu" and needs_grad:
        out = _cpu_flex_with_grad(query, key, value, attention_mask, scaling)
    else:
        out = flex_attention(
            query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=True
        )
    assert isinstance(out, Tensor)
    return out.transpose(1, 2).contiguous(), None


@cache
def _compiled_flex() -> Callable[..., Any]:
    return torch.compile(flex_attention, dynamic=False)


def _cpu_flex_with_grad(
    query: Tensor, key: Tensor, value: Tensor, block_mask: BlockMask, scale: float | None
) -> Tensor:
    """The flex higher-order op with its eager autograd (dense math), which the public entry
    point refuses to run backward on CPU (module docstring)."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop

    def identity(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        return score

    scale = query.shape[-1] ** -0.5 if scale is None else scale
    out: Tensor = flex_hop(query, key, value, identity, block_mask.as_tuple(), scale, {})[0]
    return out


AttentionInterface.register(EAGER_FLEX, _flex_attention)
AttentionInterface.register(COMPILED_FLEX, partial(_flex_attention, compiled=True))


@contextmanager
def use_flex(model: PreTrainedModel, compile: bool = False) -> Iterator[PreTrainedModel]:
    """Run ``model`` with a flex attention backend inside the block (module docstring), then
    restore its previous attention implementation."""
    before = model.config._attn_implementation
    model.set_attn_implementation(COMPILED_FLEX if compile else EAGER_FLEX)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)


def flex_forward(
    model: PreTrainedModel,
    input_ids: Tensor,
    position_ids: Tensor,
    block_mask: BlockMask,
    *,
    compile: bool = False,
) -> Tensor:
    """Logits ``[B, 2L, V]`` of ``model`` on ``input_ids [B, 2L]`` with ``block_mask``.
    transformers passes a 4-D ``BlockMask`` given as ``attention_mask`` through unchanged."""
    with use_flex(model, compile):
        out = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=block_mask,
            use_cache=False,
        )
    logits: Tensor = out.logits
    return logits


def batch_offset(batch: IDLMBatch) -> int:
    """The block offset of a batch: its first block starts at ``offset − M`` or ``0``."""
    return int(batch.block_start[0]) % batch.M


def pad_streams(input_ids: Tensor, position_ids: Tensor, Lp: int) -> tuple[Tensor, Tensor]:
    """``[x_t | x_0]`` of streams of length L, each padded at its end to ``Lp``:
    ``[x_t, pad | x_0, pad]`` (token 0) with positions ``L..Lp−1`` on the padding, both
    ``[B, 2Lp]`` (module docstring: no real position sees a padding one)."""
    B, L = input_ids.shape[0], input_ids.shape[1] // 2
    if Lp < L:
        raise ValueError(f"Lp: the padded length {Lp} is shorter than the streams' {L}")
    if Lp == L:
        return input_ids, position_ids
    pad = input_ids.new_zeros(B, Lp - L)
    more = torch.arange(L, Lp, device=position_ids.device).expand(B, -1)
    ids = torch.cat([input_ids[:, :L], pad, input_ids[:, L:], pad], 1)
    pos = torch.cat([position_ids[:, :L], more, position_ids[:, L:], more], 1)
    return ids, pos


def flex_stream_outputs(
    net: Any, batch: IDLMBatch, pad: bool, hidden: bool = False
) -> tuple[Tensor, Tensor]:
    """Noisy and clean logits ``[B, L, V]`` (``hidden``: last hidden states ``[B, L, H]``) of
    ``net`` (its attention already flex) on ``batch``, the streams padded to
    :func:`padded_length` when ``pad``; only the real positions reach the vocabulary
    projection."""
    L = batch.L
    Lp = padded_length(L) if pad else L
    ids, pos = pad_streams(batch.input_ids, batch.position_ids, Lp)
    mask = idlm_block_mask(Lp, batch.M, batch_offset(batch), device=ids.device)
    return stream_outputs(
        net, L, hidden=hidden, padded=Lp, input_ids=ids, position_ids=pos, attention_mask=mask
    )


def flex_idlm_forward(
    model: PreTrainedModel, batch: IDLMBatch, *, compile: bool = False, pad: bool | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`~brisk.runtime.train.idlm.idlm_forward` with the ``BlockMask`` twin of
    ``batch.attention_mask`` (which is not read): noisy and clean logits, each ``[B, L, V]``.
    ``pad`` (default: ``compile``) pads the streams to :func:`padded_length`."""
    with use_flex(model, compile):
        return flex_stream_outputs(model, batch, compile if pad is None else pad)
