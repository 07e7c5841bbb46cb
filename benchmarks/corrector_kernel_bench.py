"""The corrector head per verify round: eager vs fused vs fused + CUDA graph, at Qwen3-8B shapes.

Shapes: H = 4096, V = 151,936, M = 7 (N = 8), K = 16, the paper's head
(``CorrectorConfig.paper``: state 128, projections 64/64/16/16, rank 64, FP32 head), bf16
backbone tensors (input embedding E and LM head E_out as random [V, H] tables, MASK and anchor
hidden states, candidate logits), batch C ∈ {1, 8, 32}. Rows:

- **eager, gathered rows** — the naive loop, projecting ``[C, M, K, H]`` gathered rows of E and
  E_out every round (the head before folded tables);
- **eager** — the naive loop on 64-wide rows of the folded tables P_e·E and W_c·E_out
  (``[V, 64]`` each, computed once per checkpoint);
- **fused** — the Triton kernel (one launch for the sequential part);
- **fused + CUDA graph** — :class:`CorrectorGraphs` replay.

GPU timings are medians of ``--repeats`` (≥ 100) calls after warm-up, each timed with
``torch.cuda.Event``; the head's share is its latency ÷ one ISD forward (2N − 1 slots per request
over ``--context`` cached tokens) of a Qwen3-8B-shaped model with random weights (36 layers,
bf16; ``--layers`` to change), both as transformers runs it eagerly (the host launching every
layer's kernels) and replayed from a CUDA graph over a static cache (causal mask, the same
slots), the cost of a served forward. On CPU only the eager rows run (wall-clock medians; the fused
kernel on CPU is Triton's interpreter, which says nothing about speed) and the script says that
the GPU rows need a GPU.

    python benchmarks/corrector_kernel_bench.py [--batch 1,8,32] [--repeats 100] [--json F]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from brisk.runtime.corrector import Corrector, CorrectorConfig, CorrectorInputs

H, V, M, K = 4096, 151_936, 7, 16


class TableBackbone:
    """The frozen tables the head reads, random, in the backbone's dtype."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        g = torch.Generator(device="cpu").manual_seed(0)
        self.vocab_size, self.hidden_size = V, H
        self.E = (0.02 * torch.randn(V, H, generator=g)).to(device=device, dtype=dtype)
        self.E_out = (0.02 * torch.randn(V, H, generator=g)).to(device=device, dtype=dtype)

    def embed(self, ids: Tensor) -> Tensor:
        return self.E[ids]

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        return self.E_out[ids]


def time_ms(fn: Callable[[], Any], repeats: int, cuda: bool, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def inputs(C: int, device: torch.device, dtype: torch.dtype) -> CorrectorInputs:
    g = torch.Generator(device="cpu").manual_seed(C)
    logits, ids = (3 * torch.randn(C, M, 1024, generator=g)).topk(K, dim=-1)
    ids = ids * 148  # spread over the vocabulary
    return CorrectorInputs(
        anchor_hidden=torch.randn(C, H, generator=g).to(device, dtype),
        anchor_ids=torch.randint(0, V, (C,), generator=g).to(device),
        mask_hidden=torch.randn(C, M, H, generator=g).to(device, dtype),
        cand_logits=logits.to(device, dtype),
        cand_ids=ids.to(device),
        u=torch.rand(C, M, generator=g).to(device),
    )


@functools.cache
def forward_backbone(layers: int) -> Any:
    """A Qwen3-8B-shaped model with random bf16 weights on the GPU (built once)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from brisk.runtime.backbone import HFBackbone

    config = Qwen3Config(
        hidden_size=H,
        intermediate_size=12288,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=V,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    return HFBackbone(model, mask_token_id=V - 1)


def forward_ms(C: int, layers: int, context: int, repeats: int) -> float:
    """One ISD forward (2N − 1 slots per request) of a Qwen3-8B-shaped model, random bf16."""
    backbone = forward_backbone(layers)
    cache = backbone.new_cache()
    with torch.inference_mode():
        backbone.forward(torch.randint(0, V - 1, (C, context), device="cuda"), cache)
        ids = torch.randint(0, V - 1, (C, 2 * M + 1), device="cuda")

        def fwd() -> None:
            backbone.forward(ids, cache)
            backbone.trim(cache, context)

        return time_ms(fwd, max(repeats // 5, 20), cuda=True)


def forward_graph_ms(C: int, layers: int, context: int, repeats: int) -> float:
    """The same forward replayed from a CUDA graph over a static KV cache (causal mask): what a
    served forward costs without the host's per-layer launches."""
    from transformers import StaticCache

    model = forward_backbone(layers).model
    S = 2 * M + 1
    cache = StaticCache(config=model.config, max_cache_len=context + S)
    with torch.inference_mode():
        prefix = torch.randint(0, V - 1, (C, context), device="cuda")
        model(
            input_ids=prefix,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.arange(context, device="cuda"),
        )
        ids = torch.randint(0, V - 1, (C, S), device="cuda")
        positions = torch.arange(context, context + S, device="cuda")

        # transformers' static layers write at a running counter, not at cache_position: every
        # forward (and every replay) first puts the counter back at the prefix's end, inside
        # the graph (one tiny fill per layer, ≈ 1 µs each)
        counters = [
            layer.cumulative_length
            for layer in cache.layers
            if isinstance(getattr(layer, "cumulative_length", None), Tensor)
        ]

        def fwd() -> Tensor:
            for counter in counters:
                counter.fill_(context)
            return model(
                input_ids=ids, past_key_values=cache, use_cache=True, cache_position=positions
            ).logits

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fwd()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fwd()
        return time_ms(graph.replay, max(repeats // 5, 20), cuda=True)


@torch.inference_mode()
def measure(
    head: Corrector, backbone: TableBackbone, C: int, device: torch.device, args: Any
) -> dict[str, Any]:
    """One table row: the head's latencies at batch C (and the forward's, on a GPU)."""
    cuda = device.type == "cuda"
    x = inputs(C, device, torch.bfloat16)

    def eager(fold: bool) -> None:
        head.fold_tables = fold
        head.select(backbone, x, 1.0, impl="naive")
        head.fold_tables = True

    row: dict[str, Any] = {"C": C}
    row["eager_gather_ms"] = time_ms(lambda: eager(False), args.repeats, cuda)
    row["eager_ms"] = time_ms(lambda: eager(True), args.repeats, cuda)
    if cuda:
        from brisk.runtime.kernels.corrector_step.graph import CorrectorGraphs

        graphs = CorrectorGraphs(head, backbone, buckets=(C,))
        want = head.select(backbone, x, 1.0, impl="naive")
        fused = head.select(backbone, x, 1.0, impl="triton")
        replay = graphs.select(backbone, x, 1.0)
        row["tokens_equal"] = bool(
            torch.equal(fused.tokens, want.tokens) and torch.equal(replay.tokens, want.tokens)
        )
        row["max_logit_diff"] = max(
            float((fused.refined - want.refined).abs().max()),
            float((replay.refined - want.refined).abs().max()),
        )
        row["fused_ms"] = time_ms(
            lambda: head.select(backbone, x, 1.0, impl="triton"), args.repeats, cuda
        )
        row["graph_ms"] = time_ms(lambda: graphs.select(backbone, x, 1.0), args.repeats, cuda)
        if not args.no_forward:
            row["forward_ms"] = forward_ms(C, args.layers, args.context, args.repeats)
            try:
                row["forward_graph_ms"] = forward_graph_ms(
                    C, args.layers, args.context, args.repeats
                )
            except Exception as e:  # reported beside the table; the other rows still run
                row["forward_graph_error"] = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.empty_cache()
    return row


def speedup(row: dict[str, Any], key: str) -> str:
    return f"{row['eager_ms'] / row[key]:.1f}×" if key in row else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--layers", type=int, default=36, help="layers of the forward (GPU)")
    ap.add_argument("--context", type=int, default=512, help="cached tokens before the round")
    ap.add_argument("--no-forward", action="store_true", help="skip the forward (GPU)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    console = Console()
    torch.manual_seed(0)
    backbone = TableBackbone(device, torch.bfloat16)
    head = Corrector(CorrectorConfig.paper(hidden_size=H, vocab_size=V, M=M)).to(device).eval()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.02)
    t = time.perf_counter()
    head.tables(backbone)
    fold_s = time.perf_counter() - t
    batches = [int(b) for b in args.batch.split(",")]
    rows = [measure(head, backbone, C, device, args) for C in batches]

    def cell(row: dict[str, Any], key: str) -> str:
        return f"{row[key]:.3f}" if key in row else "needs a GPU"

    title = f"Corrector head per verify round, Qwen3-8B shapes, {device.type}"
    table = Table(
        "C",
        "eager, gathered rows (ms)",
        "eager (ms)",
        "fused (ms)",
        "fused + graph (ms)",
        "speed-up fused",
        "speed-up graph",
        "forward (ms)",
        "head ÷ forward",
        "graphed forward (ms)",
        "head ÷ graphed forward",
        "tokens = eager",
        title=title,
    )
    for row in rows:

        def share(key: str, row: dict[str, Any] = row) -> str:
            return f"{100 * row['graph_ms'] / row[key]:.2f} %" if key in row else "–"

        table.add_row(
            str(row["C"]),
            cell(row, "eager_gather_ms"),
            cell(row, "eager_ms"),
            cell(row, "fused_ms"),
            cell(row, "graph_ms"),
            speedup(row, "fused_ms"),
            speedup(row, "graph_ms"),
            cell(row, "forward_ms"),
            share("forward_ms"),
            cell(row, "forward_graph_ms"),
            share("forward_graph_ms"),
            str(row.get("tokens_equal", "–")),
        )
        if "forward_graph_error" in row:
            console.print(f"C = {row['C']}: graphed forward failed: {row['forward_graph_error']}")
    console.print(table)
    console.print(f"folding the two [V, 64] tables once: {fold_s:.2f} s on {device.type}")
    if not cuda:
        console.print(
            "GPU rows (fused, fused + CUDA graph, share of the forward) need a GPU: "
            "unmeasured on this machine."
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"device": device.type, "fold_s": fold_s, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
