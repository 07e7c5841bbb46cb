"""Greedy decoding speed on the tiny model: autoregressive (AR) vs ISD at N = 4 and 8.

For each batch size, the same held-out prompts are decoded greedily by

- **AR**: a plain transformers KV-cache loop (left-padded batch, one token per forward), and
- **ISD** at stride N through :func:`brisk.runtime.isd.decode`,

and the table shows tokens/s (output tokens, cut at EOS, per wall second), TPF (output tokens
per forward), the speed-up ISD ÷ AR and the **loop efficiency** (ISD tok/s ÷ AR tok/s) ÷ TPF:
1.0 means an ISD round costs exactly one AR step, i.e. the loop around the forward is free.
Because an ISD forward feeds 2N − 1 slots where AR feeds one, the forward alone can cost more
than an AR step on a CPU; the ``fwd ceiling`` column measures that bound directly (the time of
one AR step ÷ the time of one ISD-shaped forward, same cache length, no loop around either).
Greedy ISD reproduces greedy AR token for token; the script checks it.

The **loop ÷ fwd** column is the decode loop's own cost: the wall time spent outside the
backbone's forward calls divided by the time inside them (each forward is timed with the device
synchronized after it, so on a GPU the time a forward's kernels take is charged to the forward,
not to the host code that waits for them). The goal at batch 1 is ≤ 0.10.

    python benchmarks/decode_bench.py --model runs/tiny/base/final [--batch 1,8,32]
        [--device cpu|cuda] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from brisk.runtime.backbone import HFBackbone, cache_keyword
from brisk.runtime.isd import ISDOptions, decode
from brisk.runtime.loader import load_model
from brisk.runtime.train.base.config import BaseTrainConfig


def prompts_of(model_dir: Path, n: int, tokenizer: Any) -> list[list[int]]:
    cfg = BaseTrainConfig.load(model_dir / "train_config.json")
    problems = cfg.task.build(split="test", n=n, seed=cfg.eval_seed).problems()
    bos = tokenizer.bos_token_id
    return [[bos, *tokenizer.encode(p.prompt, add_special_tokens=False)] for p in problems]


def cut(tokens: list[int], eos: int, budget: int) -> list[int]:
    tokens = tokens[:budget]
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@torch.inference_mode()
def ar_greedy(
    model: Any, prompts: list[list[int]], max_new: int, eos: int, pad: int
) -> list[list[int]]:
    """Left-padded batched greedy decoding with a DynamicCache: one forward per token."""
    width, dev = max(len(p) for p in prompts), model.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=dev)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=dev)
    cache = DynamicCache(config=model.config)
    kv = cache_keyword(model)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=dev)
    out = []
    for _ in range(max_new):
        positions = (mask.cumsum(1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        logits = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{kv: cache},
        ).logits
        nxt = logits[:, -1].argmax(-1)
        out.append(nxt)
        done |= nxt == eos
        if bool(done.all()):
            break
        ids = nxt[:, None]
        mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], 1)
    rows = torch.stack(out, 1).tolist()
    return [cut(r, eos, max_new) for r in rows]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> tuple[float, Any]:
    walls, result = [], None
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), result


class ForwardClock:
    """Wraps ``backbone.forward`` to add up the wall time inside it (device synchronized)."""

    def __init__(self, backbone: HFBackbone) -> None:
        self.backbone, self.inner, self.seconds = backbone, backbone.forward, 0.0

    def __enter__(self) -> ForwardClock:
        device = self.backbone.device

        def forward(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            start = time.perf_counter()
            out = self.inner(*args, **kwargs)
            sync(device)
            self.seconds += time.perf_counter() - start
            return out

        self.backbone.forward = forward  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.backbone.forward


@torch.inference_mode()
def forward_ceiling(model: Any, stride: int, context: int, repeats: int = 200) -> float:
    """Time of one cached AR step ÷ time of one cached (2N − 1)-slot forward, batch 1."""
    dev = model.device
    cache = DynamicCache(config=model.config)
    kv = cache_keyword(model)
    model(input_ids=torch.randint(5, 20, (1, context), device=dev), use_cache=True, **{kv: cache})

    def step(width: int) -> float:
        ids = torch.randint(5, 20, (1, width), device=dev)
        for _ in range(10):
            model(input_ids=ids, use_cache=True, **{kv: cache})
            cache.crop(context - cache.get_seq_length())
        sync(dev)
        start = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=ids, use_cache=True, **{kv: cache})
            cache.crop(context - cache.get_seq_length())
        sync(dev)
        return time.perf_counter() - start

    return step(1) / step(2 * stride - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("runs/tiny/base/final"))
    parser.add_argument("--prompts", type=int, default=32, help="held-out problems")
    parser.add_argument("--batch", default="1,8,32", help="batch sizes")
    parser.add_argument("--strides", default="4,8")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="cpu, cuda (default: brisk's)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 (default: brisk's)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.model.is_dir():
        parser.error(f"--model: {args.model} is not a checkpoint directory (run `make tiny`)")
    torch.set_num_threads(args.threads)
    try:  # the one loader every command uses: its device and dtype defaults and checks
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    except ValueError as err:
        parser.error(str(err))
    tokenizer, backbone, device = loaded.tokenizer, loaded.backbone, loaded.placement.device
    model = backbone.model  # the AR baseline runs the same weights
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = prompts_of(args.model, args.prompts, tokenizer)
    batches = [int(b) for b in args.batch.split(",")]
    strides = [int(n) for n in args.strides.split(",")]
    context = round(statistics.mean(len(p) for p in prompts)) + args.max_new_tokens // 2
    ceilings = {N: forward_ceiling(model, N, context) for N in strides}

    rows = []
    for B in batches:
        chunks = [prompts[i : i + B] for i in range(0, len(prompts), B)]
        wall_ar, ar_out = timed(
            lambda chunks=chunks: [
                t for c in chunks for t in ar_greedy(model, c, args.max_new_tokens, eos, pad)
            ],
            args.repeats,
            device,
        )
        n_tokens = sum(len(t) for t in ar_out)
        rows.append(
            {
                "mode": "AR",
                "N": 1,
                "batch": B,
                "tokens": n_tokens,
                "wall_s": wall_ar,
                "tok_s": n_tokens / wall_ar,
                "tpf": 1.0,
            }
        )
        for N in strides:
            options = ISDOptions(stride=N, max_new_tokens=args.max_new_tokens, eos_token_id=eos)
            wall, result = timed(
                lambda options=options, B=B: decode(backbone, prompts, options, batch_size=B),
                args.repeats,
                device,
            )
            with ForwardClock(backbone) as clock:  # one more run, its forwards timed
                loop_wall, _ = timed(
                    lambda options=options, B=B: decode(backbone, prompts, options, batch_size=B),
                    1,
                    device,
                )
            outputs = [cut(list(t), eos, args.max_new_tokens) for t in result.tokens]
            if outputs != ar_out:
                raise SystemExit(f"N = {N}, batch {B}: greedy ISD differs from greedy AR")
            tokens = sum(len(t) for t in outputs)
            loop = (loop_wall - clock.seconds) / clock.seconds
            tpf = tokens / result.forwards
            speedup = (tokens / wall) / (n_tokens / wall_ar)
            rows.append(
                {
                    "mode": "ISD",
                    "N": N,
                    "batch": B,
                    "tokens": tokens,
                    "wall_s": wall,
                    "tok_s": tokens / wall,
                    "tpf": tpf,
                    "speedup": speedup,
                    "efficiency": speedup / tpf,
                    "ceiling": ceilings[N],
                    "loop_over_forward": loop,
                }
            )

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    title = f"greedy decoding, {where}, {args.threads} thread(s)"
    table = Table(
        "mode",
        "N",
        "batch",
        "tokens",
        "wall s",
        "tok/s",
        "TPF",
        "× AR",
        "(×AR)/TPF",
        "fwd ceiling",
        "loop ÷ fwd",
        title=title,
    )
    for r in rows:
        isd = r["mode"] == "ISD"
        table.add_row(
            r["mode"],
            str(r["N"]) if isd else "–",
            str(r["batch"]),
            str(r["tokens"]),
            f"{r['wall_s']:.2f}",
            f"{r['tok_s']:.0f}",
            f"{r['tpf']:.2f}",
            f"{r['speedup']:.2f}" if isd else "1",
            f"{r['efficiency']:.2f}" if isd else "–",
            f"{r['ceiling']:.2f}" if isd else "–",
            f"{r['loop_over_forward']:.2f}" if isd else "–",
        )
    Console().print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
