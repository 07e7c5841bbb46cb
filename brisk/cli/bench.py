"""``brisk bench serve``: the serving sweep (:mod:`brisk.runtime.serving.bench`) from the shell;
``brisk bench speed``: Spec-Bench's per-category report over answer files
(:mod:`brisk.runtime.speed`); ``brisk bench requests``: a server's answers, one request at a
time, written as such a file."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from brisk._atomic import atomic_write_text
from brisk.cli._common import add_config_arguments, comma_separated, flag_errors
from brisk.runtime.decode_options import LoopOptions

__all__ = ["register"]


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("bench", help="benchmarks against running servers")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = commands.add_parser(
        "serve",
        help="the paper's serving sweep over sglang.benchmark.serving (one server, or several "
        "compared by paired ratios)",
        description="Sweep concurrency C against one or more OpenAI-compatible servers with "
        "sglang.benchmark.serving: random-id prompts of a fixed length or a file's prompts "
        "(--prompts), exactly --output-len tokens per request or up to EOS (--stop-at-eos), "
        "--runs runs per C. Prints aggregate and median-request tokens/s, p95 "
        "latency and the server's TPF; with several --url, the paired tokens/s ratios of every "
        "later server to every earlier one (e.g. B ÷ A, C ÷ A, C ÷ B) per C and their geometric "
        "mean across C. Writes serve_bench.{md,json,png}.",
    )
    s.add_argument(
        "--url",
        action="append",
        required=True,
        help="server base URL; repeat it to compare servers (later ÷ earlier)",
    )
    s.add_argument("--label", action="append", help="a name per --url (default: A, B, C, …)")
    s.add_argument(
        "--tokenizer",
        required=True,
        help="a local tokenizer directory (random-ids prompts are built with it)",
    )
    s.add_argument(
        "--prompts",
        type=Path,
        help='a JSON Lines file of {"prompt": ...} rows (e.g. brisk tasks export) to draw the '
        "requests from, instead of random ids (--input-len is then unused)",
    )
    s.add_argument(
        "--stop-at-eos",
        action="store_true",
        help="let each response end at its EOS (--output-len a cap) instead of "
        "generating exactly --output-len tokens",
    )
    s.add_argument(
        "--concurrency", type=comma_separated(int, "concurrencies"), default=[1, 2, 4, 8, 16, 32]
    )
    s.add_argument("--runs", type=int, default=3)
    s.add_argument("--input-len", type=int, default=128)
    s.add_argument("--output-len", type=int, default=2048)
    s.add_argument("--prompts-per-c", type=int, default=4, help="requests per run = this × C")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--ready-timeout",
        type=int,
        default=60,
        help="seconds to wait for each server to answer /v1/models",
    )
    s.add_argument("--out", type=Path, required=True, help="directory for results and logs")
    s.set_defaults(run=_serve)
    _register_speed(commands)
    _register_requests(commands)


def _register_speed(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = commands.add_parser(
        "speed",
        help="speed-up, tokens per verify and equal outputs per prompt category (Spec-Bench's "
        "speed.py and equal.py) of answer files against plain decoding's",
        description="Read answer files (brisk decode --batch-size 1 --out, or brisk bench "
        "requests against a server) and print, per prompt category and over all, each run's "
        "speed-up over the baseline (mean tokens/s over requests, ratio of means, paired "
        "bootstrap interval), τ = tokens per target forward, and how many outputs equal the "
        "baseline's token for token. Writes speed.md and speed.json with --out.",
    )
    s.add_argument(
        "--baseline",
        type=Path,
        required=True,
        help="plain decoding's answers (brisk decode --plain, or brisk bench requests against "
        "a server without speculative decoding)",
    )
    s.add_argument(
        "--run",
        action="append",
        required=True,
        dest="runs",
        metavar="NAME=FILE",
        help="a method's answers to the same prompts; repeat it for several",
    )
    s.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    s.add_argument("--out", type=Path, default=None, help="directory for speed.{md,json}")
    s.set_defaults(run=_speed)


def _speed(args: argparse.Namespace) -> int:
    import json

    from brisk.runtime.speed import markdown, speed_report

    runs = []
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--run: expected NAME=FILE, got {item!r}")
        runs.append((name, path))
    rows = speed_report(args.baseline, runs, seed=args.seed)
    text = markdown(rows)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "speed.md", text)
        summary = {
            "baseline": str(args.baseline),
            "runs": dict(runs),
            "rows": [r.to_json() for r in rows],
        }
        atomic_write_text(args.out / "speed.json", json.dumps(summary, indent=1) + "\n")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rich.console import Console

    from brisk.runtime.serving import bench, bench_summary

    labels = args.label or [chr(ord("A") + i) for i in range(len(args.url))]
    if len(args.url) > 8:
        raise ValueError(f"--url: at most 8 servers, got {len(args.url)}")
    if len(labels) != len(args.url) or len(set(labels)) != len(labels):
        raise ValueError(f"--label: need one distinct name per --url, got {labels}")
    if not (Path(args.tokenizer) / "tokenizer_config.json").is_file():
        raise ValueError(f"--tokenizer: {args.tokenizer} holds no tokenizer_config.json")
    if importlib.util.find_spec("sglang") is None:
        raise ValueError(
            "brisk bench serve drives sglang.benchmark.serving: install the "
            "serving extra (pip install 'brisk[serving]', or make serving-venv)"
        )
    options = bench.ServeBenchOptions(
        concurrencies=tuple(args.concurrency),
        runs=args.runs,
        input_len=args.input_len,
        output_len=args.output_len,
        prompts_per_c=args.prompts_per_c,
        temperature=args.temperature,
        seed=args.seed,
        ready_timeout_s=args.ready_timeout,
        prompts=None if args.prompts is None else str(args.prompts),
        stop_at_eos=args.stop_at_eos,
    )
    servers = dict(zip(labels, args.url, strict=True))
    console = Console(stderr=True)
    total = len(options.concurrencies) * options.runs * len(servers)
    done = 0

    def on_run(run: bench.Run) -> None:
        nonlocal done
        done += 1
        console.print(
            f"[{done}/{total}] {run.server} C = {run.concurrency} run {run.run}: "
            f"{run.aggregate_tps:.1f} tok/s"
        )

    try:
        runs = bench.sweep(servers, args.tokenizer, options, args.out, on_run)
    except RuntimeError as err:  # a server down or failing requests: one line, exit 2
        raise ValueError(str(err)) from err
    rows = bench_summary.summarize(runs)
    pairs = bench_summary.comparisons(runs, labels)
    text = bench_summary.markdown(rows) + "".join(
        "\n" + bench_summary.ratio_table(ratios, names) for names, ratios in pairs.items()
    )
    print(text, end="")
    atomic_write_text(args.out / "serve_bench.md", text)
    first = next(iter(pairs.values()), [])
    atomic_write_text(
        args.out / "serve_bench.json",
        bench_summary.dumps(bench_summary.to_json(runs, rows, first, options, servers, pairs)),
    )
    bench_summary.plot(rows, pairs, args.out / "serve_bench.png")
    console.print(f"wrote {args.out}/serve_bench.{{md,json,png}}")
    return 0


def _register_requests(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = commands.add_parser(
        "requests",
        help="a server's answers to a prompts file, one request at a time, as an answer file "
        "for brisk bench speed",
        description="Send each prompt of --prompts (encoded as brisk decode encodes it) to "
        "the server's /generate alone and write one row per request: the output's token ids, "
        "tokens, the target's forwards (speculative servers: verify forwards + 1), the "
        "request's wall time and its category.",
    )
    s.add_argument("--url", required=True, help="the server's base URL (http://127.0.0.1:30000)")
    s.add_argument(
        "--tokenizer", type=Path, required=True, help="the served model's tokenizer directory"
    )
    s.add_argument("--prompts", type=Path, required=True, help='JSON Lines {"prompt", ...}')
    # each request's budget and temperature, as brisk's loops take them
    add_config_arguments(
        s, LoopOptions, exclude=("top_k", "eos_token_id"), dest_prefix="ask_", negatable=False
    )
    s.add_argument("--seed", type=int, default=0, help="request r samples with seed + r")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    s.add_argument("--out", type=Path, required=True, help="the answer file (JSON Lines)")
    s.set_defaults(run=_requests)


def _requests(args: argparse.Namespace) -> int:
    from brisk.cli._common import config_overrides, with_overrides
    from brisk.runtime.loader import load_tokenizer
    from brisk.runtime.prompts import PartialRows, check_output_file, read_prompts, write_jsonl
    from brisk.runtime.serving.answers import server_answers

    ask = with_overrides(LoopOptions(), config_overrides(args, LoopOptions, "ask_"))
    check_output_file(args.out, "--out")
    with flag_errors({"prompts"}):
        requests = read_prompts(args.prompts)
    tokenizer = load_tokenizer(args.tokenizer, where="--tokenizer")
    partial = PartialRows(args.out)  # the answers so far, kept if the server fails midway
    try:
        rows = server_answers(
            args.url,
            requests,
            tokenizer,
            ask,
            seed=args.seed,
            timeout_s=args.timeout,
            on_answer=partial.add,
        )
    except ValueError as err:
        partial.close()
        raise ValueError(f"{err} (the answers before it: {partial.path})") from None
    write_jsonl(args.out, rows)
    partial.remove()
    print(f"wrote {len(rows)} answers to {args.out}")
    return 0
