"""The tensor side of a chain verify inside SGLang, for :class:`~brisk.runtime.serving.worker.
BriskISDWorker`: where its requests' ISD state lives, the attention mask custom-mask backends
read, and the verify attention of SGLang's CPU (torch-native) backend.

- :class:`PoolStates` — every request's :class:`~brisk.runtime.isd.batched.ISDState` as one row
  of device tables indexed by SGLang's request-pool index;
- :func:`verify_mask` — the flattened ``[prefix ones | chain]`` rows of a chain verify;
- :func:`chain_layout`, :func:`chain_attention` — one attention call per layer for the whole
  batch's verify slots;
- :func:`verify_attention` — the plugin's hook of SGLang's torch-native attention, which routes
  the CPU verify forwards to :func:`chain_attention`.

Importing this module imports nothing of SGLang (the hook imports it when SGLang calls it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn.functional import scaled_dot_product_attention

from brisk.runtime.isd.batched import ISDState, StepContext, init_state

__all__ = [
    "ChainLayout",
    "PoolStates",
    "chain_attention",
    "chain_layout",
    "verify_attention",
    "verify_mask",
]


class PoolStates:
    """Every request's ISD state, one row per index of SGLang's request pool.

    Each field of :class:`ISDState` is a ``[rows, …]`` tensor on the model's device, allocated
    once at the pool's size (``req_to_token``'s rows), so a forward reads its batch's states
    with one indexed gather per field at ``batch.req_pool_indices`` and writes the next states
    back with one indexed write: no per-request Python, no host transfer.

    A row belongs to the request that holds its pool row only if it was written during that
    request's tenure. SGLang bumps a pool row's generation (``req_to_token_pool.req_generation``,
    a CPU tensor) whenever it hands the row out, and each row here keeps the generation it was
    written at (:meth:`claim`): the row of a finished, aborted or retracted request is stale the
    moment its pool row goes to another request, which overwrites it at its prefill or, reaching
    decode without one here, cold-starts (:meth:`missing`).
    """

    def __init__(self, rows: int, ctx: StepContext, device: torch.device | str) -> None:
        # a tensor per field: init_state keeps its arguments as the fields (no copies)
        zeros = [torch.zeros(rows, dtype=torch.long, device=device) for _ in range(4)]
        self.table = init_state(*zeros, ctx)
        self.written = torch.full((rows,), -1, dtype=torch.long)  # generation per row (CPU)

    def read(self, index: Tensor) -> ISDState:
        """The rows at ``index [B]`` (device), a batch of states."""
        return self.table.select(index)  # type: ignore[no-any-return]

    def write(self, index: Tensor, rows: ISDState) -> None:
        """``rows`` (B states) into the rows at ``index [B]`` (device)."""
        self.table = _put(self.table, index, rows)

    def claim(self, index_cpu: Tensor, generation: Tensor) -> None:
        """Mark the rows at ``index_cpu`` as written for the requests holding them now."""
        self.written[index_cpu] = generation[index_cpu]

    def missing(self, index_cpu: Tensor, generation: Tensor) -> Tensor:
        """``[B]`` bool (CPU): rows at ``index_cpu`` not written for the request holding them."""
        return self.written[index_cpu] != generation[index_cpu]

    def clear(self) -> None:
        self.written.fill_(-1)


def _put(table: Any, index: Tensor, rows: Any) -> Any:
    """``table`` with ``rows`` written at ``index``: the inverse of ``table.select(index)``,
    one indexed write per tensor field (nested dataclasses alike). A field the table lacks and
    ``rows`` holds (the logs' q, the head's other block: the step fills them, a cold start does
    not) is allocated at the table's size; one ``rows`` lacks is zeroed at ``index``, as
    ``ISDState.concat`` fills it; boolean flags are or-ed, as there."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(table):
        old, new = getattr(table, f.name), getattr(rows, f.name)
        if dataclasses.is_dataclass(old):
            old = _put(old, index, new)
        elif isinstance(new, Tensor):
            if old is None:
                old = new.new_zeros((table.rows(), *new.shape[1:]))
            old[index] = new.to(old.dtype)
        elif isinstance(old, Tensor):
            old[index] = 0
        elif isinstance(new, bool):
            old = old or new
        values[f.name] = old
    return dataclasses.replace(table, **values)


def verify_mask(seq_lens: Tensor, seq_lens_cpu: Tensor, n: int) -> Tensor:
    """The custom attention mask of a chain verify for backends that read one (SGLang's CUDA
    paths): per request b, n rows of ``seq_len_b + n`` entries, ones over its KV prefix and
    the lower-triangular chain over its n verify slots, flattened request after request.

    Built by index arithmetic on the device (``seq_lens [B]``); ``seq_lens_cpu`` gives the
    total length on the host, so nothing is read back from the device.

    >>> verify_mask(torch.tensor([1, 0]), torch.tensor([1, 0]), 2).int().tolist()
    [1, 1, 0, 1, 1, 1, 1, 0, 1, 1]
    """
    bs, device = seq_lens.shape[0], seq_lens.device
    widths = (seq_lens.long() + n).repeat_interleave(n)  # [bs·n] each mask row's length
    total = int(seq_lens_cpu.sum()) * n + bs * n * n
    row = torch.repeat_interleave(torch.arange(bs * n, device=device), widths, output_size=total)
    col = torch.arange(total, device=device) - (widths.cumsum(0) - widths)[row]
    prefix = seq_lens.long().repeat_interleave(n)[row]  # the row's KV prefix length
    slot = (torch.arange(bs * n, device=device) % n)[row]  # which verify slot the row is
    return (col < prefix) | (col - prefix <= slot)


@dataclass(frozen=True)
class ChainLayout:
    """Where a chain verify's batch reads its KV and what each verify slot may see, the same for
    every layer of a forward (:func:`chain_layout`, then :func:`chain_attention` per layer)."""

    at: Tensor  # [B, W] KV locations in sequence order, padding at the request's first one
    visible: Tensor  # [B, 1, n, W] verify slot i of request b sees positions ≤ seq_len_b + i


def chain_layout(slots: Tensor, seq_lens: Tensor, n: int, width: int) -> ChainLayout:
    """``slots [B, ≥ width]`` each request's KV locations in sequence order (``req_to_token``
    rows; its n verify slots sit at ``seq_len .. seq_len + n − 1``), ``seq_lens [B]`` the KV
    prefix before them, ``width`` W ≥ max(seq_len) + n (known on the host). Padding positions
    read the request's first KV slot: finite, and masked out (weight exactly 0)."""
    col = torch.arange(width, device=seq_lens.device)
    limit = seq_lens.long()[:, None] + torch.arange(n, device=seq_lens.device)  # [B, n]
    at = slots[:, :width].long()
    at = torch.where(col <= limit[:, -1:], at, at[:, :1])
    return ChainLayout(at, (col <= limit[..., None])[:, None])


def chain_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, layout: ChainLayout, scale: float | None = None
) -> Tensor:
    """Attention of every request's n verify slots over its KV, batched: ``q [B·n, Hq, D]``
    (request after request), the pool's ``k_cache`` / ``v_cache [slots, Hkv, D]``; verify slot
    i of request b attends to positions 0 .. seq_len_b + i, its prefix and the chain up to
    itself (``layout``). Returns ``[B·n, Hq, D]``.

    One padded call instead of SGLang's per-request loop, which also computes a query row for
    every prefix position (``[seq_len + n]²`` scores per request, where n × (seq_len + n) are
    needed).
    """
    B, Hq, D = layout.at.shape[0], q.shape[1], q.shape[2]
    key = k_cache[layout.at].to(q.dtype).transpose(1, 2)  # [B, Hkv, W, D]
    value = v_cache[layout.at].to(q.dtype).transpose(1, 2)
    query = q.view(B, -1, Hq, D).transpose(1, 2)  # [B, Hq, n, D]
    out = scaled_dot_product_attention(
        query, key, value, attn_mask=layout.visible, scale=scale, enable_gqa=key.shape[1] != Hq
    )
    return out.transpose(1, 2).reshape(q.shape)


def verify_attention(
    original: Any,
    self: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
) -> Any:
    """``TorchNativeAttnBackend.forward_extend`` for TARGET_VERIFY (AROUND hook).

    SGLang builds a verify batch like a decode one (no ``extend_prefix_lens`` /
    ``extend_seq_lens``; ``seq_lens`` without the n verify slots) and then routes it to
    ``forward_extend``. Plain self-attention layers (Qwen3's) write the verify slots' K/V as
    ``forward_extend`` does and attend by :func:`chain_attention`; any other layer runs
    ``forward_extend`` itself with each request's prefix its ``seq_len``, its extend n and its KV
    length ``seq_len + n``, where SDPA's causal mask is exactly the chain's.
    """
    if not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, save_kv_cache)
    seq_lens = forward_batch.seq_lens
    n = q.shape[0] // seq_lens.shape[0]
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    plain = (
        not layer.is_cross_attention
        and layer.attn_type != AttentionType.ENCODER_ONLY
        and getattr(layer, "sliding_window_size", None) in (None, -1)
        and layer.qk_head_dim == layer.v_head_dim
        and forward_batch.encoder_lens is None
        and getattr(self, "swa_out_cache_loc", None) is None
        and forward_batch.seq_lens_cpu is not None
    )
    if plain:
        pool = self.token_to_kv_pool
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        layout = getattr(forward_batch, "brisk_chain_layout", None)
        if layout is None:  # the first layer of this forward; the others share it
            width = int(forward_batch.seq_lens_cpu.max()) + n
            slots = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices, :width]
            layout = chain_layout(slots, seq_lens, n, width)
            forward_batch.brisk_chain_layout = layout
        out = chain_attention(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            layout,
            layer.scaling,
        )
        return out.reshape(q.shape[0], -1)
    saved = (
        forward_batch.seq_lens,
        forward_batch.extend_prefix_lens,
        forward_batch.extend_seq_lens,
    )
    forward_batch.extend_prefix_lens = seq_lens
    forward_batch.extend_seq_lens = torch.full_like(seq_lens, n)
    forward_batch.seq_lens = seq_lens + n
    try:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache)
    finally:
        (
            forward_batch.seq_lens,
            forward_batch.extend_prefix_lens,
            forward_batch.extend_seq_lens,
        ) = saved
