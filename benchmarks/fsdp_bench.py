"""A few FSDP2 training steps of a random Qwen3-shaped model: tokens/s and peak memory.

Run under torchrun (one process per GPU; gloo on CPU)::

    torchrun --standalone --nproc-per-node 1 benchmarks/fsdp_bench.py --shape 0.6b \\
        --device cuda --precision bf16 --attention flex-compiled --checkpointing --L 4096

Each step is brisk's training step (:mod:`brisk.runtime.train.distributed` and the I-DLM loss of
:mod:`brisk.runtime.train.proposal.recipe`): ``--batch`` random sequences of ``L`` tokens (a quarter
prompt, ``M = 7``) laid out as ``[x_t | x_0]`` (2L positions), the mask as a dense tensor or its
FlexAttention BlockMask, forward, loss over the global counts, backward, gradient clipping and an
AdamW step on the FSDP2-sharded model. The model is set up as the training loops do it
(``Dist.from_env``: each rank on ``cuda:LOCAL_RANK``, gloo for CPU tensors and nccl for CUDA
ones; ``load_for_training``: rank 0 builds the random fp32 model on the host, the others
only its shards). One warm-up step (which compiles) precedes ``--steps`` timed ones;
**tokens/s** counts the 2L positions of every row of the global batch per median step time;
**peak** is ``torch.cuda.max_memory_allocated`` over the timed steps on CUDA and the process's
maximum resident set on CPU (rank 0); **graphs** is how many graphs dynamo compiled (compiled
flex: one per padded length and grad mode, so 1 here).

Shapes: ``0.6b`` is Qwen3-0.6B (28 layers, hidden 1024, 16/8 heads of 128, FFN 3072, vocabulary
151,936, tied embeddings, ≈ 0.6 B parameters); ``tiny`` (2 layers, hidden 64) checks the script
on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from brisk.runtime.train.distributed import Dist, autocast, load_for_training
from brisk.runtime.train.forward import set_attention, training_forward
from brisk.runtime.train.idlm import IGNORE, build_batch, weighted_loss

M = 7
SHAPES: dict[str, dict[str, Any]] = {
    "0.6b": dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--attention", choices=["dense", "flex", "flex-compiled"], default="flex")
    p.add_argument("--checkpointing", action="store_true", help="per-layer activation ckpt")
    p.add_argument("--L", type=int, default=1024, help="response + prompt tokens per row")
    p.add_argument("--batch", type=int, default=1, help="rows per rank")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM, Qwen3Config

    dist = Dist.from_env(fsdp=True)
    if args.device == "cuda" and dist.device.type != "cuda":
        p.error("--device cuda: torch sees no CUDA device")
    device = dist.device if args.device == "cuda" else torch.device("cpu")
    config = Qwen3Config(**SHAPES[args.shape])

    def load() -> Any:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    setup = dict(fsdp=True, precision=args.precision, checkpointing=args.checkpointing)
    model, net = load_for_training(load, dist, device=device, **setup)
    n_params = sum(p.numel() for p in model.parameters())  # DTensors count their global size
    set_attention(model, args.attention)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    precision = autocast(args.precision, True, device)
    g = torch.Generator().manual_seed(dist.rank)
    seqs = torch.randint(0, config.vocab_size - 1, (args.batch, args.L), generator=g).tolist()
    batch = build_batch(
        seqs,
        [args.L // 4] * args.batch,
        M,
        config.vocab_size - 1,
        0,
        device=device,
        dense_mask=args.attention == "dense",
    )

    def step() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with precision:
            noisy, clean = training_forward(net, batch, args.attention)
        ones = (batch.noisy_labels != IGNORE).float()
        out = weighted_loss(noisy, clean, batch, ones, "auto", dist)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    step()  # warm-up (and compilation)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = [step() for _ in range(args.steps)]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    median = statistics.median(times)
    row = {
        "shape": args.shape,
        "params": n_params,
        "ranks": dist.world,
        "device": args.device,
        "precision": args.precision,
        "attention": args.attention,
        "checkpointing": args.checkpointing,
        "L": args.L,
        "rows_per_rank": args.batch,
        "step_s": median,
        "tokens_per_s": 2 * args.L * args.batch * dist.world / median,
        "peak_gib": peak / 2**30,
        "graphs": counters["stats"]["unique_graphs"],
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    if dist.rank == 0:
        print(
            " | ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
            )
        )
        if args.json:
            args.json.write_text(json.dumps(row, indent=2))
    import torch.distributed as tdist

    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
