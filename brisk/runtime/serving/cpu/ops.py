"""Plain-torch versions of the ``sgl_kernel`` CPU ops SGLang 0.5.23's CPU engine calls.

Each function has the signature of the op of the same name in sgl-kernel's CPU build (the
arguments SGLang passes at its call site) and does what SGLang's Triton kernel of the same job
does, written as the definition. They are index bookkeeping on the KV pool, not arithmetic, so
plain torch is exact. Call sites in SGLang:

- ``mem_cache/allocation.py`` — :func:`assign_req_to_token_pool_cpu`;
- ``kernels/ops/kvcache/cache_move.py`` — :func:`copy_all_layer_kv_cache_cpu` (moving accepted
  draft KV, ``move_kv_cache``);
- ``kernels/ops/speculative/cache_locs.py`` — :func:`assign_extend_cache_locs_cpu`,
  :func:`assign_draft_cache_locs_contiguous_cpu`;
- ``kernels/ops/speculative/eagle.py`` — :func:`fill_accept_out_cache_loc_cpu`,
  :func:`fill_bonus_tokens_cpu`.

Shapes: B requests, ``req_to_token: [pool_rows, pool_len]`` (a request's KV slot per position).
"""

from __future__ import annotations

import ctypes

import torch

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
]


def _spans(
    req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Row and column of every position ``start_i <= c < end_i`` of every request, in order."""
    start = start_offset.to(torch.int64)
    lengths = end_offset.to(torch.int64) - start  # [B]
    total = int(lengths.sum())
    rows = req_pool_indices.to(torch.int64).repeat_interleave(lengths)  # [total]
    first = torch.cumsum(lengths, 0) - lengths  # [B] where request i's span begins in the output
    cols = torch.arange(total) - first.repeat_interleave(lengths) + start.repeat_interleave(lengths)
    return rows, cols, total


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write newly allocated slots into the pool, request after request.

    ``req_to_token[r_i, s_i : e_i] = out_cache_loc[o_i : o_i + e_i − s_i]`` with
    ``o_i = Σ_{j<i} (e_j − s_j)``; ``r, s, e: [B]``, ``out_cache_loc: [≥ Σ (e − s)]``.
    """
    assert pool_len == req_to_token.shape[1], "pool_len is req_to_token's row length"
    rows, cols, total = _spans(req_pool_indices, start_offset, end_offset)
    req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Read slots out of the pool, request after request (the inverse of the op above).

    ``out_cache_loc[o_i : o_i + e_i − s_i] = req_to_token[r_i, s_i : e_i]``, ``o_i`` as above.
    """
    assert pool_len == req_to_token.shape[1], "pool_len is req_to_token's row length"
    rows, cols, total = _spans(req_pool_indices, start_offset, end_offset)
    out_cache_loc[:total] = req_to_token[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Each request's ``n = topk · num_cols`` slots after its sequence, packed per request.

    ``out_cache_loc[i·n + j] = req_to_token[r_i, L_i + j]`` for ``j < n``; ``L = seq_lens: [B]``.
    """
    n = topk * num_cols
    start = seq_lens.to(torch.int64)
    end = start + n
    assign_extend_cache_locs_cpu(
        req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len
    )


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """The slots of the accepted draft positions, packed in order (−1 marks a rejected one).

    ``accept_out_cache_loc[k] = out_cache_loc[a_k]`` for the k-th entry ``a_k != −1`` of
    ``accept_index`` (flattened, row-major); the rest of the output is left as it was.
    """
    index = accept_index.reshape(-1)
    kept = index[index != -1].to(torch.int64)
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """Each request's last accepted token (the bonus token; ``accept_lens`` counts it).

    ``bonus_tokens[i] = accept_tokens.flatten()[accept_stride · i + accept_lens[i] − 1]``.
    """
    b = accept_lens.numel()
    flat = accept_tokens.reshape(-1)
    at = torch.arange(b) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens[:b] = flat[at].to(bonus_tokens.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy slot rows ``src_loc`` to ``tgt_loc`` in every K/V buffer of the pool.

    ``buf_b[tgt_loc[i], :] = buf_b[src_loc[i], :]`` for each buffer b; ``data_ptrs: [n_buf]``
    uint64 base addresses, ``strides: [n_buf]`` int64 bytes per slot row. All source rows of a
    buffer are read before any target row is written, so overlapping locations are safe (like
    SGLang's Triton kernel, gather then scatter). The buffers are addressed by pointer, as
    SGLang hands them over, and viewed as bytes: the copy is exact for every dtype.
    """
    assert data_ptrs.numel() == strides.numel(), "one stride per buffer"
    assert tgt_loc.numel() == src_loc.numel(), "one target per source"
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.to(torch.int64), src_loc.to(torch.int64)
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(ptr)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)  # [rows, stride] bytes
        buf[tgt] = buf[src]  # the right side is a gathered copy
