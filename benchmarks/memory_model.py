"""A written memory model of one I-DLM training step per GPU, and a check against measurements.

Per GPU, for a decoder-only model with N parameters, n_l layers, hidden H, FFN width F, a query
heads of width d (a·d = H here), vocabulary V, trained on S = 2L positions ([x_t | x_0]) per
sequence, b sequences per micro-batch, P ranks:

- **states** (FSDP2, fp32 master weights, fp32 gradients, AdamW's two fp32 moments, all
  sharded): 16 N / P bytes; DDP keeps all of them on every rank: 16 N;
- **gathered layer** (FSDP2 all-gathers one layer's bf16 parameters for its forward and
  backward, and prefetches the next): 2 · 2 N_layer;
- **checkpointed inputs** (activation checkpointing per decoder layer keeps each layer's input,
  bf16): n_l · b S H · 2;
- **one layer recomputed** in the backward (bf16; the usual count of a transformer layer's saved
  tensors without the attention scores: QKV, attention output, two norms, the FFN's three
  F-wide tensors): b S (10 H + 3 F) · 2;
- **attention scores**: with a fused kernel O(b S a) bytes, i.e. none to speak of. That holds
  for FlexAttention and, in current torch, also for sdpa with an arbitrary additive mask (its
  memory-efficient kernels take one, on CUDA and on CPU; the CPU check below confirms it): the
  dense mask costs **the mask itself**, S² · 2 bytes (bf16), not the scores. Only sdpa's math
  fallback materializes scores and probabilities, b a S² · 2 · 2 bytes for the layer being
  (re)computed (the ``math`` rows);
- **logits**: b S V · (2 bf16 + 4 fp32 for the loss + 4 its gradient) bytes, unless the loss is
  computed in chunks of the vocabulary or sequence (then a chunk's worth).

Without checkpointing the scores and layer activations are kept for every layer: n_l times the
recomputed-layer and scores terms instead of once.

The check: the same model with P = 1, fp32 everywhere (4-byte activations, no master copy:
4 + 4 + 8 = 16 bytes of state per parameter), no checkpointing, against
``benchmarks/train_bench.py``'s measured peak of the dense rows on the CPU (what a step adds
above the process's resident set after the model and optimizer exist, so the fp32 weights are
excluded but the gradients and AdamW moments, allocated by the first step, are included).

    python benchmarks/memory_model.py [--measured runs/train_bench_cpu.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

GB = 1e9


@dataclass(frozen=True)
class Shape:
    name: str
    params: float  # N
    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int

    @property
    def layer_params(self) -> float:
        return (self.params - 2 * self.vocab * self.hidden) / self.layers


QWEN3_8B = Shape("Qwen3-8B", 8.19e9, 36, 4096, 12288, 32, 151_936)
QWEN3_32B = Shape("Qwen3-32B", 32.8e9, 64, 5120, 25600, 64, 151_936)


def terms(
    m: Shape,
    L: int,
    b: int,
    P: int,
    *,
    fsdp: bool,
    flex: bool,
    checkpoint: bool,
    chunked_loss: bool,
    act_bytes: int = 2,
    state_bytes: int = 16,
    math: bool = False,
) -> dict[str, float]:
    """The model's terms in bytes per GPU (module docstring); ``math``: sdpa's math path."""
    S = 2 * L
    recompute = b * S * (10 * m.hidden + 3 * m.ffn) * act_bytes
    scores = b * m.heads * S * S * act_bytes * 2 if math else 0.0
    out = {
        "states": state_bytes * m.params / (P if fsdp else 1),
        "gathered layer": 2 * 2 * m.layer_params if fsdp else 0.0,
        "mask": 0.0 if flex else S * S * act_bytes,
        "logits": (b * S * m.vocab * (act_bytes + 8)) if not chunked_loss else 0.0,
    }
    if checkpoint:
        out["layer inputs"] = m.layers * b * S * m.hidden * act_bytes
        out["one layer recomputed"] = recompute
        out["attention scores"] = scores
    else:
        out["layer activations"] = m.layers * recompute
        out["attention scores"] = m.layers * scores
    return out


def paper_table(console: Console) -> None:
    rows = [
        (
            QWEN3_8B,
            4096,
            "DDP, dense (math path), no checkpointing",
            dict(fsdp=False, flex=False, checkpoint=False, math=True),
        ),
        (
            QWEN3_8B,
            4096,
            "FSDP2, dense (math path), checkpointing",
            dict(fsdp=True, flex=False, checkpoint=True, math=True),
        ),
        (
            QWEN3_8B,
            4096,
            "FSDP2, dense (efficient sdpa), checkpointing",
            dict(fsdp=True, flex=False, checkpoint=True),
        ),
        (QWEN3_8B, 4096, "FSDP2, flex, checkpointing", dict(fsdp=True, flex=True, checkpoint=True)),
        (
            QWEN3_32B,
            8192,
            "FSDP2, flex, checkpointing",
            dict(fsdp=True, flex=True, checkpoint=True),
        ),
        (
            QWEN3_32B,
            8192,
            "FSDP2 over 8 × TP 4 (≈ 32 shards), flex, checkpointing",
            dict(fsdp=True, flex=True, checkpoint=True, P=32),
        ),
    ]
    table = Table(
        "model",
        "L",
        "setup",
        "states",
        "layer inputs + recompute",
        "scores + mask",
        "logits (full / chunked)",
        "total (full / chunked)",
        "fits 80 GB",
        title="One micro-batch of 1 sequence per GPU, 8 GPUs, bf16 compute, fp32 "
        "master weights and AdamW",
    )
    for shape, L, label, kw in rows:
        P = int(kw.pop("P", 8))
        full = terms(shape, L, 1, P, chunked_loss=False, **kw)  # type: ignore[arg-type]
        chunk = terms(shape, L, 1, P, chunked_loss=True, **kw)  # type: ignore[arg-type]
        acts = sum(
            full.get(k, 0.0) for k in ("layer inputs", "one layer recomputed", "layer activations")
        )
        att = full["attention scores"] + full["mask"]
        tot_full, tot_chunk = sum(full.values()), sum(chunk.values())
        fits = "yes" if tot_chunk < 80 * GB * 0.9 else "no"
        if tot_full < 80 * GB * 0.9:
            fits = "yes (either)"
        table.add_row(
            shape.name,
            str(L),
            label,
            f"{full['states'] / GB:.1f}",
            f"{acts / GB:.1f}",
            f"{att / GB:.1f}",
            f"{full['logits'] / GB:.1f} / 0",
            f"{tot_full / GB:.1f} / {tot_chunk / GB:.1f}",
            fits,
        )
    console.print(table)


def check_table(console: Console, measured: Path) -> None:
    data = json.loads(measured.read_text())
    cfg = data["meta"]["model"]
    m = Shape(
        "bench",
        0.0,
        cfg["num_hidden_layers"],
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["num_attention_heads"],
        cfg["vocab_size"],
    )
    # the benchmark's parameter count, from its shapes (untied embeddings, GQA projections)
    H, F, a, kv, d = m.hidden, m.ffn, m.heads, cfg["num_key_value_heads"], cfg["head_dim"]
    layer = H * a * d + 2 * H * kv * d + a * d * H + 3 * H * F + 2 * H + 2 * d
    params = m.layers * layer + 2 * m.vocab * H + H
    m = Shape("bench", float(params), m.layers, H, F, a, m.vocab)
    table = Table(
        "L",
        "mode",
        "predicted (MiB)",
        "measured (MiB)",
        "measured ÷ predicted",
        title=f"The model at the benchmark's shape (P = 1, fp32, no checkpointing, "
        f"batch {data['meta']['batch']}), against its CPU peaks",
    )
    for row in data["rows"]:
        if row.get("status") != "ok" or row["mode"] != "dense":
            continue
        t = terms(
            m,
            row["L"],
            data["meta"]["batch"],
            1,
            fsdp=False,
            flex=False,
            checkpoint=False,
            chunked_loss=False,
            act_bytes=4,
            state_bytes=12,
        )
        predicted = sum(t.values())
        got = row["peak_bytes"]
        table.add_row(
            str(row["L"]),
            row["mode"],
            f"{predicted / 2**20:.0f}",
            f"{got / 2**20:.0f}",
            f"{got / predicted:.2f}",
        )
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", type=Path, default=Path("runs/train_bench_cpu.json"))
    args = ap.parse_args()
    console = Console(width=160)
    paper_table(console)
    if args.measured.is_file():
        check_table(console, args.measured)
    else:
        console.print(f"{args.measured}: no measurements (run benchmarks/train_bench.py)")


if __name__ == "__main__":
    main()
