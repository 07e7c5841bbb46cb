"""SmolLM2-135M-Instruct converted to an I-DLM on its own responses, measured.

    make smollm2-isd        # data, conversion (configs/smollm2_base.toml), then this report

Three steps, each its own sub-command:

- ``data``: SmolLM2's own greedy responses (``make smollm2-data``, a selfgen directory) split by
  problem into ``train.jsonl`` (what the conversion reads) and ``heldout.jsonl`` (the last
  ``--heldout`` problems, never trained on);
- ``loss``: the causal stream's held-out loss of a checkpoint, the mean next-token cross-entropy
  of the held-out responses given their prompts (teacher forcing, response tokens only): the
  conversion keeps the pretrained model where it stays within 5 % of the original's;
- ``report``: the original's and the converted model's held-out losses, ISD at stride 4 and 8
  against the converted model's plain decoding on the held-out prompts (tokens per forward,
  speed-up, outputs equal token for token; ``brisk bench speed``), the original's plain decoding
  beside them (what a user ran before converting), and ``brisk mechanism report`` of the
  stride-4 block log, into ``smollm2_isd.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine

ROOT = Path(__file__).resolve().parent.parent


def brisk(*args: str | Path) -> list[str]:
    command = [sys.executable, "-m", "brisk.cli", *(str(a) for a in args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, cwd=ROOT, env=env)
    return ["brisk", *(str(a) for a in args)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def data(selfgen: Path, out: Path, heldout: int) -> None:
    import pyarrow.parquet as pq

    parts = sorted(glob.glob(str(selfgen / "part-*.parquet")))
    if not parts:
        sys.exit(f"--selfgen: {selfgen} holds no part-*.parquet (run make smollm2-data)")
    rows = [
        r
        for p in parts
        for r in pq.read_table(p, columns=["problem", "prompt", "response"]).to_pylist()
    ]
    rows.sort(key=lambda r: r["problem"])
    if not 0 < heldout < len(rows):
        sys.exit(f"--heldout: need 0 < {heldout} < {len(rows)} responses")
    pairs = [{"prompt": r["prompt"], "response": r["response"]} for r in rows]
    write_jsonl(out / "train.jsonl", pairs[:-heldout])
    write_jsonl(out / "heldout.jsonl", pairs[-heldout:])
    print(f"{len(pairs) - heldout} training and {heldout} held-out responses in {out}")


def causal_loss(model_dir: Path, pairs: Path) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) of the held-out responses given their prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for row in read_jsonl(pairs):
            prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
            response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + response])
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            target = torch.tensor(response)
            total += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
            count += len(response)
    return {"ce": total / count, "tokens": count, "ppl": math.exp(total / count)}


def report(args: argparse.Namespace) -> None:
    work: Path = args.work
    held = read_jsonl(work / "heldout.jsonl")[: args.prompts]
    prompts = work / "prompts.jsonl"
    write_jsonl(
        prompts,
        [
            {"id": f"stdlib-{i}", "prompt": r["prompt"], "category": "stdlib"}
            for i, r in enumerate(held)
        ],
    )
    started = time.time()
    losses = {
        name: causal_loss(path, work / "heldout.jsonl")
        for name, path in (("original", args.model), ("converted", args.isd_model))
    }
    rise = losses["converted"]["ce"] / losses["original"]["ce"] - 1
    print(
        f"held-out causal CE: {losses['original']['ce']:.4f} → {losses['converted']['ce']:.4f}"
        f" nats ({100 * rise:+.1f} %)"
    )
    common = [
        "--prompts",
        prompts,
        "--max-new-tokens",
        args.max_new_tokens,
        "--temperature",
        "0",
        "--threads",
        "1",
        "--no-progress",
    ]
    commands: dict[str, list[str]] = {}
    answers: dict[str, Path] = {}
    for name, model, flags in (
        ("plain-original", args.model, ["--plain"]),
        ("plain", args.isd_model, ["--plain"]),
        (
            "isd4",
            args.isd_model,
            ["--stride", "4", "--batch-size", "1", "--log-blocks", work / "isd4-blocks"],
        ),
        ("isd8", args.isd_model, ["--stride", "8", "--batch-size", "1"]),
    ):
        out = work / f"{name}.jsonl"
        out.unlink(missing_ok=True)
        commands[name] = brisk("decode", "--model", model, *common, "--out", out, *flags)
        answers[name] = out
    # the converted model's own plain decoding is the baseline ISD must equal token for token;
    # the original's is what a user ran before converting
    runs = [a for n in ("isd4", "isd8", "plain-original") for a in ("--run", f"{n}={answers[n]}")]
    commands["speed"] = brisk(
        "bench", "speed", "--baseline", answers["plain"], *runs, "--out", work / "speed"
    )
    commands["mechanism"] = brisk(
        "mechanism", "report", work / "isd4-blocks", "--out", work / "mechanism"
    )
    summary: dict[str, Any] = {
        "causal_loss": losses,
        "causal_loss_rise": rise,
        "speed": json.loads((work / "speed" / "speed.json").read_text()),
        "mechanism": _mechanism(work / "mechanism"),
        "training": _training(args.isd_model),
        "prompts": len(held),
        "max_new_tokens": args.max_new_tokens,
        "commands": commands,
        "wall_s": time.time() - started,
        "machine": machine(threads=1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smollm2_isd.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out / 'smollm2_isd.json'}")


def _mechanism(directory: Path) -> Any:
    found = sorted(directory.glob("*.json"))
    return {p.name: json.loads(p.read_text()) for p in found}


def _training(isd_model: Path) -> dict[str, Any]:
    """The conversion run's start config, last train record and wall time (its metrics log)."""
    for log in (isd_model / "metrics.jsonl", isd_model.parent / "metrics.jsonl"):
        if log.is_file():
            records = read_jsonl(log)
            train = [r for r in records if r.get("event") == "train"]
            return {
                "log": str(log.relative_to(ROOT) if log.is_relative_to(ROOT) else log),
                "steps": train[-1]["step"] if train else 0,
                "last": train[-1] if train else None,
                "first": train[0] if train else None,
            }
    return {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("data", help="split SmolLM2's own responses into train and held-out")
    p.add_argument("--selfgen", type=Path, default=ROOT / "runs" / "smollm2" / "selfgen")
    p.add_argument("--heldout", type=int, default=32)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "smollm2" / "isd")
    p = sub.add_parser("loss", help="a checkpoint's held-out causal loss")
    p.add_argument("model", type=Path)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "smollm2" / "isd")
    p = sub.add_parser("report", help="losses, ISD speed and the mechanism report")
    p.add_argument("--model", type=Path, default=ROOT / "runs" / "smollm2" / "model")
    p.add_argument(
        "--isd-model", type=Path, default=ROOT / "runs" / "smollm2" / "isd" / "base" / "final"
    )
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "smollm2" / "isd")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.command == "data":
        data(args.selfgen, args.work, args.heldout)
    elif args.command == "loss":
        print(json.dumps(causal_loss(args.model, args.work / "heldout.jsonl")))
    else:
        report(args)


if __name__ == "__main__":
    main()
