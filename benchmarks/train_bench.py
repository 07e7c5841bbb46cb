"""One I-DLM training step, dense mask vs FlexAttention BlockMask, against the sequence length.

For each L a small Qwen3-shaped model (4 layers, hidden 256, 8 query / 4 KV heads of 32, vocab
2048) takes one step on a batch of ``--batch`` random sequences of L tokens (a quarter prompt,
``M = 7``), i.e. 2L positions ``[x_t | x_0]``:

- **dense**: ``block_diffusion_mask`` → additive ``[1, 1, 2L, 2L]`` mask → ``idlm_forward``
  (sdpa), as :mod:`brisk.runtime.train.idlm` trains today;
- **flex**: ``idlm_block_mask`` (no ``[2L, 2L]`` tensor) → ``flex_idlm_forward``; with
  ``--compile`` through ``torch.compile(flex_attention, dynamic=False)`` (the fused Triton
  kernels on CUDA; L padded by :func:`~brisk.runtime.train.flex.padded_length`, which leaves
  the default lengths as they are), otherwise uncompiled flex (torch's unfused reference,
  which materializes the scores; on CPU with grad it runs the flex op's eager autograd, see
  :mod:`brisk.runtime.train.flex`). Compiled flex has no CPU backward, so ``--compile`` needs
  ``--device cuda``.

A step is: build the mask, forward, the I-DLM loss (``idlm_loss``, α auto), backward, AdamW step.
Each (L, mode) row runs in a fresh subprocess, so peaks do not contaminate each other and a row
that runs out of memory is reported as OOM. One warm-up step (which also compiles) precedes
``--steps`` timed steps; **time** is their median wall time (device synchronized).

**peak** is the memory a step adds above what the process holds once the model, optimizer and
batch exist (activations, gradients, AdamW moments, masks, the caching of the first step):

- CUDA: ``torch.cuda.max_memory_allocated()`` − ``memory_allocated()``, peak stats reset at that
  point (tensor memory; the allocator's reserve and the CUDA context are not counted);
- CPU: the process's maximum resident set (``getrusage`` ``ru_maxrss``) after the steps − its
  resident set (``/proc/self/statm``) before them: RSS, so it includes allocator slack and
  anything torch allocates outside tensors; the batch is built with a transient dense mask
  before that point, smaller than the one the dense step builds, so it does not set the max.

    PYTHONPATH=. python benchmarks/train_bench.py [--device cpu|cuda] [--dtype float32|bfloat16]
        [--lengths 256,512,1024,2048,4096] [--compile] [--batch 1] [--steps 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

MODES = ("dense", "flex")
M = 7


def model_config() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=8192,
        attn_implementation="sdpa",
    )


def make_batch(L: int, batch: int, device: torch.device) -> Any:
    """Random sequences of L tokens; the dense mask ``build_batch`` makes is dropped here (each
    step builds its own), and every tensor moves to ``device``."""
    from brisk.runtime.train.idlm import build_batch

    g = torch.Generator().manual_seed(L)
    seqs = [[1, *torch.randint(4, 2048, (L - 1,), generator=g).tolist()] for _ in range(batch)]
    b = build_batch(seqs, [L // 4] * batch, M, mask_token_id=3, pad_token_id=0)
    b = replace(b, attention_mask=torch.zeros(0))
    moved = {f.name: getattr(b, f.name) for f in fields(b)}
    return replace(b, **{k: v.to(device) for k, v in moved.items() if isinstance(v, torch.Tensor)})


def train_step(model: Any, opt: Any, batch: Any, mode: str, compile: bool) -> float:
    """One step (module docstring); returns the loss."""
    from brisk.runtime.train.flex import flex_idlm_forward
    from brisk.runtime.train.idlm import block_diffusion_mask, idlm_forward, idlm_loss

    device, dtype = batch.input_ids.device, next(model.parameters()).dtype
    if mode == "dense":
        allowed = block_diffusion_mask(batch.L, M, 0, device)
        additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
        additive.masked_fill_(~allowed, torch.finfo(dtype).min)
        noisy, clean = idlm_forward(model, replace(batch, attention_mask=additive[None, None]))
    else:
        noisy, clean = flex_idlm_forward(model, batch, compile=compile)
    loss = idlm_loss(noisy, clean, batch).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss)


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_row(args: argparse.Namespace) -> dict[str, Any]:
    """Measure one (L, mode) in this process."""
    from transformers import Qwen3ForCausalLM

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(model_config()).to(device=device, dtype=dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(args.row_L, args.batch, device)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = rss_bytes()

    walls, loss = [], 0.0
    for _ in range(1 + args.steps):  # the first step warms up (and compiles)
        sync(device)
        start = time.perf_counter()
        loss = train_step(model, opt, batch, args.row_mode, args.compile)
        sync(device)
        walls.append(time.perf_counter() - start)

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {
        "L": args.row_L,
        "mode": args.row_mode,
        "status": "ok",
        "step_s": statistics.median(walls[1:]),
        "warmup_s": walls[0],
        "peak_bytes": peak,
        "loss": loss,
    }


def spawn_row(args: argparse.Namespace, L: int, mode: str) -> dict[str, Any]:
    """Run one row in a fresh interpreter; OOM (CUDA's error or the kernel's SIGKILL) is a
    result, not a crash."""
    row = {
        "--device": args.device,
        "--dtype": args.dtype,
        "--batch": args.batch,
        "--steps": args.steps,
        "--row-L": L,
        "--row-mode": mode,
    }
    cmd = [sys.executable, __file__, *(str(x) for pair in row.items() for x in pair)]
    cmd += ["--compile"] if args.compile else []
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"L": L, "mode": mode, "status": f"timeout {args.timeout}s"}
    for line in proc.stdout.splitlines():
        if line.startswith("ROW "):
            return dict(json.loads(line[4:]))
    err = proc.stderr.strip().splitlines()
    oom = proc.returncode == -9 or any("out of memory" in e.lower() for e in err)
    return {"L": L, "mode": mode, "status": "OOM" if oom else f"error: {err[-1] if err else ''}"}


def show(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    by = {(r["L"], r["mode"]): r for r in rows}
    flex = "flex+compile" if args.compile else "flex eager"
    table = Table(
        title=f"one I-DLM training step · {args.device} {args.dtype} · batch "
        f"{args.batch} · M = {M} · median of {args.steps} · {flex}"
    )
    for col in ("L", "2L", "dense ms", "flex ms", "dense MiB", "flex MiB", "time d÷f", "peak d÷f"):
        table.add_column(col, justify="right")

    def cell(r: dict[str, Any], key: str, scale: float, fmt: str) -> str:
        return format(r[key] / scale, fmt) if r["status"] == "ok" else r["status"][:40]

    for L in args.lengths:
        d, f = by[(L, "dense")], by[(L, "flex")]
        ok = d["status"] == "ok" and f["status"] == "ok"
        table.add_row(
            str(L),
            str(2 * L),
            cell(d, "step_s", 1e-3, ",.0f"),
            cell(f, "step_s", 1e-3, ",.0f"),
            cell(d, "peak_bytes", 2**20, ",.0f"),
            cell(f, "peak_bytes", 2**20, ",.0f"),
            f"{d['step_s'] / f['step_s']:.2f}" if ok else "–",
            f"{d['peak_bytes'] / max(f['peak_bytes'], 1):.2f}" if ok else "–",
        )
    Console().print(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument(
        "--lengths", default="256,512,1024,2048,4096", type=lambda s: [int(x) for x in s.split(",")]
    )
    p.add_argument("--compile", action="store_true", help="torch.compile flex_attention (CUDA)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--timeout", type=int, default=900, help="seconds per row")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--row-L", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--row-mode", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compile and args.device == "cpu":
        p.error("--compile: compiled flex_attention has no backward on CPU; use --device cuda")
    if args.row_L is not None:
        print("ROW " + json.dumps(run_row(args)), flush=True)
        return

    rows = []
    for L in args.lengths:
        for mode in MODES:
            rows.append(spawn_row(args, L, mode))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    show(rows, args)
    if args.json is not None:
        import transformers

        meta = {
            "device": args.device,
            "dtype": args.dtype,
            "compile": args.compile,
            "batch": args.batch,
            "steps": args.steps,
            "M": M,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "model": model_config().to_dict(),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))


if __name__ == "__main__":
    main()
