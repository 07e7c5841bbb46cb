"""The eager corrector head's cost per verify round, as a share of the backbone forward (CPU).

For each backbone shape and batch size C, one ISD verify round is timed in two parts:

- **forward**: the backbone on ``[pending, x_1..x_M, MASK×M]`` (2N − 1 slots per request) over
  a KV cache of ``--context`` tokens (the cache is trimmed back after every call, so every
  repeat sees the same length);
- **head**: :meth:`Corrector.select` on that forward's M MASK slots — the parallel projections
  plus the sequential minimal-GRU loop over M positions with its ~15 small ops each (the eager
  reference the fused kernel replaces), at T = 1 with uniforms.

The table shows medians over ``--repeats`` calls after warm-up and the head's share
head ÷ forward: the number the fused kernel has to beat. Shapes: the paper-regime tiny world
(H = 128, 4 layers, V = 40) and a wider random Qwen3 (H = 1024, 8 layers, V = 32,000) to show
how the share moves as the backbone grows; the head is ``CorrectorConfig.paper`` (K = 16,
state 128, rank 64) sized for each. One torch thread unless ``--threads``.

    python benchmarks/corrector_head_cost.py [--batch 1,8,32] [--repeats 30] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import Qwen3Config, Qwen3ForCausalLM

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector, CorrectorConfig, CorrectorInputs

SHAPES = {  # name → Qwen3 sizes
    "tiny world (H 128, 4 layers, V 101)": dict(
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=101,
    ),
    "wider (H 1024, 8 layers, V 32k)": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=32_000,
    ),
}


def backbone_of(sizes: dict[str, int]) -> HFBackbone:
    torch.manual_seed(0)
    config = Qwen3Config(max_position_embeddings=1024, tie_word_embeddings=False, **sizes)
    config._attn_implementation = "sdpa"
    return HFBackbone(Qwen3ForCausalLM(config).eval(), mask_token_id=sizes["vocab_size"] - 1)


def median_s(fn: Any, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@torch.inference_mode()
def measure(backbone: HFBackbone, C: int, M: int, context: int, repeats: int) -> dict[str, float]:
    V, H = backbone.vocab_size, backbone.hidden_size
    g = torch.Generator().manual_seed(C)
    cache = backbone.new_cache()
    backbone.forward(torch.randint(0, V - 1, (C, context), generator=g), cache)
    ids = torch.randint(0, V - 1, (C, 2 * M + 1), generator=g)
    ids[:, M + 1 :] = backbone.mask_token_id

    def forward() -> Any:
        out = backbone.forward(ids, cache)
        backbone.trim(cache, context)
        return out

    out = forward()
    with torch.inference_mode(False):  # weights that track versions (the folded tables' key)
        head = Corrector(CorrectorConfig.paper(hidden_size=H, vocab_size=V, M=M)).eval()
        for p in head.parameters():  # a trained-looking head: nothing is skipped at zero
            torch.nn.init.normal_(p, std=0.02)
    K = head.config.K
    mask_logits = out.logits[:, M + 1 :]
    cand_logits, cand_ids = mask_logits.topk(K, dim=-1)
    block = CorrectorInputs(
        anchor_hidden=out.hidden[:, M],
        anchor_ids=ids[:, M],
        mask_hidden=out.hidden[:, M + 1 :],
        cand_logits=cand_logits,
        cand_ids=cand_ids,
        u=torch.rand(C, M, generator=g),
    )

    def select() -> Any:
        return head.select(backbone, block, 1.0)

    f = median_s(forward, repeats)
    h = median_s(select, repeats)
    return {"forward_ms": 1e3 * f, "head_ms": 1e3 * h, "share": h / f}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8,32", help="batch sizes C")
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--context", type=int, default=64, help="cached tokens before the round")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=None, help="comma-separated subset of shape indices")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",")]
    names = list(SHAPES)
    if args.shapes is not None:
        names = [names[int(i)] for i in args.shapes.split(",")]
    rows = []
    table = Table(
        "backbone",
        "C",
        "forward (ms)",
        "eager head (ms)",
        "head ÷ forward",
        title=f"Eager corrector per verify round, N = {args.stride}, CPU, {args.threads} thread(s)",
    )
    for name in names:
        backbone = backbone_of(SHAPES[name])
        for C in batches:
            r = measure(backbone, C, args.stride - 1, args.context, args.repeats)
            rows.append({"backbone": name, "C": C, **r})
            table.add_row(
                name,
                str(C),
                f"{r['forward_ms']:.2f}",
                f"{r['head_ms']:.2f}",
                f"{100 * r['share']:.1f} %",
            )
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
