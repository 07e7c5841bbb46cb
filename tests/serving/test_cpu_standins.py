"""brisk's CPU stand-ins for SGLang: each ``sgl_kernel`` op against its definition written as a
loop (exact: they move indices and bytes), the stand-in's names against SGLang's CPU import
sites, and activation only where asked for (``--device cpu``), never by importing brisk."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from brisk.runtime.serving.cpu import STANDINS, activate
from brisk.runtime.serving.cpu.ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)

SIZES = [
    pytest.param(1, 1, id="B1-len1"),
    pytest.param(3, 7, id="B3-len7"),
    pytest.param(5, 32, id="B5-len32"),
    pytest.param(8, 33, id="B8-len33"),
]


def spans(batch: int, max_len: int, pool_len: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Distinct pool rows, and per request ``0 <= start <= end <= pool_len`` (empty spans too)."""
    rows = torch.randperm(batch + 3, generator=g)[:batch]
    start = torch.randint(0, pool_len - max_len + 1, (batch,), generator=g)
    end = start + torch.randint(0, max_len + 1, (batch,), generator=g)
    return rows, start, end


@pytest.mark.parametrize(("batch", "max_len"), SIZES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_assign_req_to_token_pool(batch: int, max_len: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(batch * 100 + max_len)
    pool_len = 64
    rows, start, end = spans(batch, max_len, pool_len, g)
    pool = torch.randint(0, 1000, (batch + 3, pool_len), generator=g, dtype=dtype)
    out_cache_loc = torch.randint(0, 1000, (int((end - start).sum()) + 2,), generator=g)
    ref, o = pool.clone(), 0
    for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist(), strict=True):
        for c in range(s, e):
            ref[r, c] = int(out_cache_loc[o])
            o += 1
    assign_req_to_token_pool_cpu(rows, pool, start, end, out_cache_loc, pool_len)
    torch.testing.assert_close(pool, ref, rtol=0, atol=0)


@pytest.mark.parametrize(("batch", "max_len"), SIZES)
def test_assign_extend_cache_locs(batch: int, max_len: int) -> None:
    g = torch.Generator().manual_seed(batch * 100 + max_len)
    pool_len = 64
    rows, start, end = spans(batch, max_len, pool_len, g)
    pool = torch.randint(0, 1000, (batch + 3, pool_len), generator=g, dtype=torch.int32)
    total = int((end - start).sum())
    out = torch.full((total + 2,), -7, dtype=torch.int64)
    ref = [
        int(pool[r, c])
        for r, s, e in zip(rows.tolist(), start.tolist(), end.tolist(), strict=True)
        for c in range(s, e)
    ]
    assign_extend_cache_locs_cpu(rows, pool, start, end, out, pool_len)
    assert out.tolist() == [*ref, -7, -7]  # nothing written past the spans


@pytest.mark.parametrize(("topk", "num_cols"), [(1, 1), (1, 4), (2, 3), (4, 8)])
def test_assign_draft_cache_locs_contiguous(topk: int, num_cols: int) -> None:
    g = torch.Generator().manual_seed(topk * 10 + num_cols)
    batch, pool_len, n = 3, 80, topk * num_cols
    rows = torch.tensor([4, 0, 2])
    seq_lens = torch.randint(0, pool_len - n + 1, (batch,), generator=g)
    pool = torch.randint(0, 1000, (5, pool_len), generator=g, dtype=torch.int32)
    out = torch.empty(batch * n, dtype=torch.int64)
    ref = [
        int(pool[r, L + j])
        for r, L in zip(rows.tolist(), seq_lens.tolist(), strict=True)
        for j in range(n)
    ]
    assign_draft_cache_locs_contiguous_cpu(rows, pool, seq_lens, out, pool_len, topk, num_cols)
    assert out.tolist() == ref


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (4, 3), (7, 9)], ids=str)
def test_fill_accept_out_cache_loc(shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(shape[0] * 10 + shape[1])
    out_cache_loc = torch.randint(0, 1000, (shape[0] * shape[1],), generator=g)
    accept_index = torch.randint(0, out_cache_loc.numel(), shape, generator=g)
    accept_index[torch.rand(shape, generator=g) < 0.4] = -1
    out = torch.full((accept_index.numel(),), -3, dtype=torch.int64)
    ref = [int(out_cache_loc[a]) for a in accept_index.reshape(-1).tolist() if a != -1]
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    assert out.tolist() == ref + [-3] * (out.numel() - len(ref))


@pytest.mark.parametrize(("batch", "stride"), [(1, 1), (1, 6), (3, 4), (9, 8)])
def test_fill_bonus_tokens(batch: int, stride: int) -> None:
    g = torch.Generator().manual_seed(batch * 10 + stride)
    accept_tokens = torch.randint(0, 1000, (batch, stride), generator=g)
    accept_lens = torch.randint(1, stride + 1, (batch,), generator=g, dtype=torch.int32)
    bonus = torch.empty(batch, dtype=torch.int64)
    fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, stride)
    assert bonus.tolist() == [int(accept_tokens[i, int(accept_lens[i]) - 1]) for i in range(batch)]


LOCS = [
    pytest.param([5], [2], id="one"),
    pytest.param([3, 4, 5], [2, 3, 4], id="shift-right-overlapping"),
    pytest.param([2, 3, 4], [3, 4, 5], id="shift-left-overlapping"),
    pytest.param([0, 7, 1, 6], [6, 1, 7, 0], id="swap"),
    pytest.param([], [], id="none"),
]


@pytest.mark.parametrize(("tgt", "src"), LOCS)
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_copy_all_layer_kv_cache(tgt: list[int], src: list[int], loc_dtype: torch.dtype) -> None:
    """``buf[tgt[i]] = buf[src[i]]`` in every buffer, all sources read before any write."""
    g = torch.Generator().manual_seed(len(tgt))
    # K and V of two layers, in three dtypes and two row widths
    buffers = [
        torch.randn(10, heads, 8, generator=g).to(dtype)
        for heads, dtype in [
            (2, torch.float32),
            (2, torch.bfloat16),
            (2, torch.float16),
            (1, torch.float32),
        ]
    ]
    expected = []
    for buf in buffers:
        before, ref = buf.clone(), buf.clone()
        for t, s in zip(tgt, src, strict=True):
            ref[t] = before[s]
        expected.append(ref)
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(
        data_ptrs, strides, torch.tensor(tgt, dtype=loc_dtype), torch.tensor(src, dtype=loc_dtype)
    )
    for buf, ref in zip(buffers, expected, strict=True):
        assert torch.equal(buf.view(torch.uint8), ref.view(torch.uint8))  # bit for bit


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_importing_brisk_activates_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import importlib.util, brisk, brisk.runtime.serving, brisk.runtime.serving.launch\n"
        "print(importlib.util.find_spec('sgl_kernel'))"
    )
    result = python(code, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def test_the_standin_covers_sglangs_cpu_import_sites() -> None:
    """Under ``activate()`` and SGLang's CPU engine, every module that imports ``sgl_kernel`` at
    module level on CPU imports; the names are exactly those; the tree ops fail when called."""
    env = {**activate(), "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    code = """
import sgl_kernel, sglang.srt.mem_cache.allocation, sglang.kernels.ops.kvcache.cache_move
import sglang.kernels.ops.speculative.cache_locs, sglang.kernels.ops.speculative.eagle
import sglang.kernels.ops.speculative.spec_tree, sglang.kernels.ops.speculative.multi_layer_eagle
print(sgl_kernel.__file__)
print(",".join(sorted(sgl_kernel.__all__)))
try:
    sgl_kernel.verify_tree_greedy_cpu()
except NotImplementedError as err:
    print(err)
"""
    result = python(code, env)
    assert result.returncode == 0, result.stderr[-3000:]
    path, names, error = result.stdout.strip().splitlines()
    assert path == str(STANDINS / "sgl_kernel" / "__init__.py")
    assert names.split(",") == sorted(
        [
            "assign_draft_cache_locs_contiguous_cpu",
            "assign_extend_cache_locs_cpu",
            "assign_req_to_token_pool_cpu",
            "build_tree_kernel_efficient_cpu",
            "copy_all_layer_kv_cache_cpu",
            "fill_accept_out_cache_loc_cpu",
            "fill_bonus_tokens_cpu",
            "rotate_input_ids_cpu",
            "verify_tree_greedy_cpu",
        ]
    )
    assert "verify_tree_greedy_cpu" in error
