"""The CPU serving table (issue 20, point 5): plain SGLang AR vs ISD head off vs ISD head on.

Starts three real SGLang servers on this machine's CPU (brisk's CPU flags, the plugin, one
thread each, loopback ports), all serving the paper-regime checkpoint (``make paper``); the
head-on server adds the distilled corrector of ``make reproduce-corrector``. Then one
``brisk bench serve`` sweep over the three, runs interleaved per (C, run), so every ratio is
paired under the same machine load: aggregate and median-request tokens/s, the server's TPF,
the paired ratios isd-off ÷ ar, isd-on ÷ ar, isd-on ÷ isd-off per C and their geometric means
across C. The servers are always stopped (by their process groups).

The paper-regime model has 256 positions; a fixed output of ≥ 256 tokens after a prompt needs
more, so the servers run with ``--context-length`` raised (RoPE positions past the trained range:
the model's acceptance there is what it is, and every server sees the same prompts).

    .venv-serving/bin/python benchmarks/serve_cpu_bench.py --out runs/serve_cpu

Flags: ``--model``, ``--corrector``, ``--stride`` (8), ``--concurrency`` (1 2 4 8), ``--runs``
(3), ``--input-len`` (32), ``--output-len`` (256), ``--prompts-per-c`` (2), and ``--prompts
FILE --stop-at-eos`` for the task's own prompts at their natural lengths (passed to ``brisk
bench serve``):

    .venv/bin/brisk tasks export --checkpoint runs/paper/base/final --n 64 \
        --out runs/serve_cpu_task/prompts.jsonl
    .venv-serving/bin/python benchmarks/serve_cpu_bench.py --out runs/serve_cpu_task \
        --prompts runs/serve_cpu_task/prompts.jsonl --stop-at-eos --output-len 160
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from brisk.runtime.serving.launch import ServerProcess, server_launch, start_server

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "runs/paper/base/final")
    p.add_argument("--corrector", type=Path,
                   default=ROOT / "runs/paper/corrector_dl/arms/distilled/seed0/final")  # fmt: skip
    p.add_argument("--stride", type=int, default=8)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompts-per-c", type=int, default=2)
    p.add_argument("--prompts", type=Path, help="a JSON Lines file of prompts (brisk tasks export)")
    p.add_argument("--stop-at-eos", action="store_true", help="responses end at their EOS")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    for what, path in (("--model", args.model), ("--corrector", args.corrector)):
        if not (path / "config.json").is_file():
            p.error(f"{what}: {path} holds no checkpoint (make paper / make reproduce-corrector)")
    args.out.mkdir(parents=True, exist_ok=True)
    context = args.input_len + args.output_len + 2 * args.stride
    common = ["--dtype", "float32", "--context-length", str(max(context, 512)),
              "--max-running-requests", str(max(args.concurrency))]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}  # fmt: skip
    isd = {"stride": args.stride}
    servers = {
        "ar": None,
        "isd-off": isd,
        "isd-on": {**isd, "corrector": str(args.corrector)},
    }
    started: list[tuple[str, ServerProcess, str]] = []
    try:
        for name, options in servers.items():
            launch_on = partial(server_launch, args.model, device="cpu", extra_args=common,
                                env=env, isd=options)  # fmt: skip
            server, seconds = start_server(launch_on, args.out / f"{name}.server.log", 300)
            print(f"{name}: {server.launch.shell()}", flush=True)
            started.append((name, server, server.launch.url))
            print(f"{name}: ready in {seconds:.0f} s at {server.launch.url}", flush=True)
        bench = [sys.executable, "-m", "brisk.cli", "bench", "serve",
                 "--tokenizer", str(args.model), "--out", str(args.out),
                 "--runs", str(args.runs), "--input-len", str(args.input_len),
                 "--output-len", str(args.output_len),
                 "--prompts-per-c", str(args.prompts_per_c),
                 "--concurrency", ",".join(map(str, args.concurrency))]  # fmt: skip
        if args.prompts is not None:
            bench += ["--prompts", str(args.prompts)]
        if args.stop_at_eos:
            bench.append("--stop-at-eos")
        for name, _, url in started:
            bench += ["--url", url, "--label", name]
        t0 = time.monotonic()
        code = subprocess.run(bench, check=False).returncode
        print(f"sweep: {time.monotonic() - t0:.0f} s, exit {code}", flush=True)
        return code
    finally:
        for _, server, _ in started:
            with contextlib.suppress(Exception):
                server.stop()


if __name__ == "__main__":
    sys.exit(main())
