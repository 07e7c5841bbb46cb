"""The CPU serving table (issue 20, point 5): plain SGLang AR vs ISD head off vs ISD head on.

Starts real SGLang servers on this machine's CPU, all serving the paper-regime checkpoint
(``make paper``) and launched exactly as ``brisk serve`` launches them (:func:`server_launch`:
brisk's CPU flags and dtype, the plugin), with no flags of their own: plain AR (``ar``),
``BRISK_ISD`` head off (``isd-off``) and, when the distilled corrector of ``make
reproduce-corrector`` exists, head on (``isd-on``). Then one ``brisk bench serve`` sweep over
them, runs interleaved per (C, run), so every ratio is paired under the same machine load:
aggregate and median-request tokens/s, the server's TPF, the paired ratios of every later server
to every earlier one per C and their geometric means across C. The servers are always stopped
(by their process groups).

Two things differ from a bare ``brisk serve``, each for a reason a user would share:

- one thread per server (``OMP_NUM_THREADS=1``): the servers share this machine's 2 cores with
  each other and with ``sglang.benchmark.serving``; every server gets the same;
- ``--context-length`` only when the sweep's longest request (prompt, output cap and the 2N verify
  slots) exceeds the model's trained positions (256 for the paper-regime model; the random-id
  protocol's 32 + 256 tokens does): SGLang would refuse those requests otherwise.

At the end the worker's own lines from each ISD server's log (TPF with the prefill counted, and
per batch size the decode forward's time in the model and the worker's host time around it) are
added to the sweep's JSON as ``serve_cpu.json``.

    .venv-serving/bin/python benchmarks/serve_cpu_bench.py --out runs/serve_cpu

With ``--drafter DIR`` (a DFlash drafter of ``--model``) the servers are plain AR (``ar``) and
the drafter verified by it (``sd``, ``BRISK_DRAFTER`` as ``brisk serve --drafter`` launches it)
instead, greedy:

    .venv-serving/bin/python benchmarks/serve_cpu_bench.py --model runs/smollm2/model \
        --drafter runs/smollm2/drafters/arms/brisk/seed0/train/final --out runs/smollm2/serve \
        --prompts runs/smollm2/serve/prompts.jsonl --stop-at-eos --output-len 64 --runs 1

Flags: ``--model``, ``--corrector`` (required to exist when given; by default used when
present and ``--model`` is the default, the model it was trained on), ``--stride`` (8),
``--concurrency`` (1 2 4 8), ``--runs`` (3), ``--input-len`` (32), ``--output-len`` (256),
``--prompts-per-c`` (2), and ``--prompts FILE --stop-at-eos`` for the
task's own prompts at their natural lengths (passed to ``brisk bench serve``):

    .venv/bin/brisk tasks export --checkpoint runs/paper/base/final --n 64 \
        --out runs/serve_cpu_task/prompts.jsonl
    .venv-serving/bin/python benchmarks/serve_cpu_bench.py --out runs/serve_cpu_task \
        --prompts runs/serve_cpu_task/prompts.jsonl --stop-at-eos --output-len 160 \
        --prompts-per-c 6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from brisk.runtime.serving.launch import server_launch
from brisk.runtime.serving.process import ServerProcess, start_server

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "runs/paper/base/final"
DEFAULT_CORRECTOR = ROOT / "runs/paper/corrector_dl/arms/distilled/seed0/final"
TPF_LINE = re.compile(r"BRISK_ISD TPF ([0-9.]+): (\d+) committed tokens in (\d+) request-fo")
CLOCK_LINE = re.compile(r"BRISK_ISD decode forwards since start, by batch size: (.*)$", re.M)
CLOCK_PART = re.compile(r"B=(\d+): (\d+) forwards, model ([0-9.]+) ms, host ([0-9.]+) ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument(
        "--corrector",
        type=Path,
        help=f"default with the default model: {DEFAULT_CORRECTOR}, if present",
    )
    p.add_argument("--stride", type=int, default=8)
    p.add_argument(
        "--drafter",
        type=Path,
        help="a DFlash drafter of --model: serve plain AR and the drafter (sd) instead of ISD",
    )
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompts-per-c", type=int, default=2)
    p.add_argument("--prompts", type=Path, help="a JSON Lines file of prompts (brisk tasks export)")
    p.add_argument("--stop-at-eos", action="store_true", help="responses end at their EOS")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"--model: {args.model} holds no checkpoint (make paper)")
    corrector = args.corrector
    if corrector is not None and not (corrector / "config.json").is_file():
        p.error(f"--corrector: {corrector} holds no checkpoint (make reproduce-corrector)")
    paper_model = args.model.resolve() == DEFAULT_MODEL.resolve()
    if corrector is None and paper_model and (DEFAULT_CORRECTOR / "config.json").is_file():
        corrector = DEFAULT_CORRECTOR  # the head trained on the default model, never another's
    args.out.mkdir(parents=True, exist_ok=True)

    extra, env = [], {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    need, trained = _longest_request(args), _trained_positions(args.model)
    if need > trained:
        print(
            f"requests of up to {need} tokens exceed the model's {trained} positions: "
            f"--context-length {need}",
            flush=True,
        )
        extra = ["--context-length", str(need)]
        env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    isd = {"stride": args.stride}
    servers: dict[str, dict[str, object] | None] = {"ar": None, "isd-off": isd}
    drafters: dict[str, dict[str, object] | None] = {}
    if args.drafter is not None:
        if not (args.drafter / "config.json").is_file():
            p.error(f"--drafter: {args.drafter} holds no drafter checkpoint")
        servers, corrector = {"ar": None}, None
        drafters = {"sd": {"drafter": str(args.drafter)}}
    elif corrector is not None:
        servers["isd-on"] = {**isd, "corrector": str(corrector)}
    else:
        why = (
            f"no corrector at {DEFAULT_CORRECTOR} (make reproduce-corrector)"
            if paper_model
            else "no --corrector given for this model"
        )
        print(f"isd-on: skipped, {why}", flush=True)
    servers.update(dict.fromkeys(drafters))
    started: list[tuple[str, ServerProcess, str]] = []
    try:
        for name, options in servers.items():
            launch_on = partial(
                server_launch,
                args.model,
                device="cpu",
                extra_args=extra,
                env=env,
                isd=None if name in drafters else options,
                drafter=drafters.get(name),
            )
            server, seconds = start_server(launch_on, args.out / f"{name}.server.log", 300)
            print(f"{name}: {server.launch.shell()}", flush=True)
            started.append((name, server, server.launch.url))
            print(f"{name}: ready in {seconds:.0f} s at {server.launch.url}", flush=True)
        bench = [
            sys.executable,
            "-m",
            "brisk.cli",
            "bench",
            "serve",
            "--tokenizer",
            str(args.model),
            "--out",
            str(args.out),
            "--runs",
            str(args.runs),
            "--input-len",
            str(args.input_len),
            "--output-len",
            str(args.output_len),
            "--prompts-per-c",
            str(args.prompts_per_c),
            "--concurrency",
            ",".join(map(str, args.concurrency)),
        ]
        if args.prompts is not None:
            bench += ["--prompts", str(args.prompts)]
        if args.stop_at_eos:
            bench.append("--stop-at-eos")
        for name, _, url in started:
            bench += ["--url", url, "--label", name]
        t0 = time.monotonic()
        code = subprocess.run(bench, check=False).returncode
        print(f"sweep: {time.monotonic() - t0:.0f} s, exit {code}", flush=True)
        if code == 0:
            _write_summary(args.out, {name: server for name, server, _ in started})
        return code
    finally:
        for _, server, _ in started:
            with contextlib.suppress(Exception):
                server.stop()


def _longest_request(args: argparse.Namespace) -> int:
    """Tokens the longest request can reach: its prompt, the output cap, 2N verify slots."""
    longest = args.input_len
    if args.prompts is not None:
        from transformers import AutoTokenizer

        from brisk.runtime.serving.bench import read_prompts

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        longest = max(len(tokenizer(p).input_ids) for p in read_prompts(args.prompts))
    return int(longest + args.output_len + 2 * args.stride)


def _trained_positions(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["max_position_embeddings"])


def worker_lines(log: str) -> dict[str, Any]:
    """The ISD worker's last idle lines in a server log: TPF (prefill counted) and, per batch
    size, decode forwards with the mean ms in the model and of the worker's own host time."""
    tpf = TPF_LINE.findall(log)
    clock = CLOCK_LINE.findall(log)
    by_batch = {
        int(b): {"forwards": int(n), "model_ms": float(m), "host_ms": float(h)}
        for b, n, m, h in (CLOCK_PART.findall(clock[-1]) if clock else [])
    }
    return {
        "tpf": float(tpf[-1][0]) if tpf else None,
        "tokens": int(tpf[-1][1]) if tpf else None,
        "request_forwards": int(tpf[-1][2]) if tpf else None,
        "decode_by_batch_size": by_batch,
    }


def _write_summary(out: Path, servers: dict[str, ServerProcess]) -> None:
    """``serve_bench.json`` with each server's launch line and the ISD workers' own lines."""
    document = json.loads((out / "serve_bench.json").read_text())
    document["launch"] = {name: s.launch.shell() for name, s in servers.items()}
    document["worker"] = {
        name: worker_lines(s.log.read_text(errors="replace"))
        for name, s in servers.items()
        if name != "ar"
    }
    for name, lines in document["worker"].items():
        print(f"{name}: {json.dumps(lines)}", flush=True)
    (out / "serve_cpu.json").write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
