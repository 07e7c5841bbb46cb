"""``brisk mechanism``: validate block logs, make synthetic ones, and report the diagnostics."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from brisk.cli._common import comma_separated
from brisk.mechanism.discover import log_files
from brisk.mechanism.reader import count_blocks, log_shape, validate
from brisk.mechanism.render import notes, table_rows
from brisk.mechanism.report import write_report
from brisk.mechanism.requests import read_requests
from brisk.mechanism.runs import run_tpf_of_log
from brisk.mechanism.schema import describe_decoder
from brisk.mechanism.summary import MechanismSummary, default_ks, summarize
from brisk.mechanism.synthetic import synthetic_log
from brisk.mechanism.tally import tally_blocks

# below this many rows the pass takes about a second and a bar would only flicker
PROGRESS_MIN_ROWS = 200_000


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser(
        "mechanism", help="block-log diagnostics (the paper's mechanism analysis)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = commands.add_parser(
        "report",
        help="the paper's mechanism table with intervals, summary.json/.md and plots",
    )
    r.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="Parquet files or log dirs")
    r.add_argument("--out", type=Path, required=True, help="output directory")
    r.add_argument(
        "--k",
        type=comma_separated(int, "integers"),
        default=None,
        help="K' values for coverage (default: those of 4,8,16 up to the log's K, and K)",
    )
    r.add_argument("--bootstrap", type=int, default=1000, help="bootstrap draws (0: no intervals)")
    r.add_argument("--seed", type=int, default=0, help="bootstrap seed (≥ 0)")
    r.add_argument("--level", type=float, default=0.95, help="interval level, in (0, 1)")
    r.set_defaults(run=run_report)

    v = commands.add_parser("validate", help="check logs against the schema")
    v.add_argument("logs", nargs="+", type=Path, metavar="LOG")
    v.set_defaults(run=run_validate)

    s = commands.add_parser("synth", help="write a seeded synthetic log (for trying things out)")
    s.add_argument("out", type=Path, help="log directory to create")
    s.add_argument("--blocks", type=int, default=100_000, help="blocks to write (≥ 1)")
    s.add_argument("--M", type=int, default=7, help="proposal positions, 1..255")
    s.add_argument("--K", type=int, default=16, help="candidates per position, 2..4096")
    s.add_argument("--seed", type=int, default=0, help="seed (≥ 0)")
    s.set_defaults(run=run_synth)


def _need(ok: bool, flag: str, want: str, got: object) -> None:
    """One-line argument errors (the CLI turns ValueError into ``brisk: error: …``, exit 2)."""
    if not ok:
        raise ValueError(f"{flag}: need {want}, got {got}")


def run_report(args: argparse.Namespace) -> int:
    # every argument is checked before the (possibly long) pass over the blocks
    _need(args.bootstrap >= 0, "--bootstrap", "a number of draws ≥ 0", args.bootstrap)
    _need(args.seed >= 0, "--seed", "an integer ≥ 0", args.seed)
    _need(0 < args.level < 1, "--level", "a value strictly between 0 and 1", args.level)
    # --out or, if it does not exist yet, the nearest existing folder above it, must be a folder
    there = next(p for p in (args.out, *args.out.absolute().parents) if p.exists())
    _need(there.is_dir(), "--out", "a directory", f"the file {there}")
    K = log_shape(args.logs).K  # footers only
    _need(
        args.k is None or all(1 <= k <= K for k in args.k),
        "--k",
        f"values in 1..K = {K}",
        ",".join(map(str, args.k or [])),
    )
    total = count_blocks(args.logs)
    console, err = Console(), Console(stderr=True)
    if not console.is_terminal:  # a log file or pipe: don't wrap the table at 80 columns
        console = Console(width=140)
    start = time.perf_counter()
    with Progress(
        TextColumn("reading blocks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=total < PROGRESS_MIN_ROWS or not err.is_terminal,
    ) as bar:
        task = bar.add_task("blocks", total=total)
        tally = tally_blocks(args.logs, progress=lambda n: bar.advance(task, n))
    show = total >= PROGRESS_MIN_ROWS and err.is_terminal
    with err.status("bootstrap, tables and plots") if show else nullcontext():
        files = [str(f) for f in log_files(args.logs)]
        ks = args.k if args.k is not None else default_ks(tally.shape.K)
        requests = read_requests(args.logs, tally.shape.M)
        summary = summarize(tally, ks, args.bootstrap, args.seed, args.level, files, requests)
        written = write_report(summary, args.out)
    print_table(summary, console)
    console.print(
        f"wrote {', '.join(p.name for p in written)} to {args.out} "
        f"({time.perf_counter() - start:.1f} s)",
        style="dim",
    )
    return 0


def print_table(s: MechanismSummary, console: Console) -> None:
    pct = round(100 * s.level)
    table = Table(
        "Quantity",
        "Population / unit",
        f"Equal-request [{pct}% CI]",
        "Pooled",
        "Requests",
        box=box.SIMPLE_HEAD,
        title=f"Mechanism diagnostics: {s.n_blocks:,} blocks, {s.n_requests:,} requests, "
        f"M = {s.shape.M}, K = {s.shape.K}",
    )
    section = None
    for row in table_rows(s):
        if row.section != section:
            section = row.section
            table.add_row(f"[italic]{section}[/]", "", "", "", "")
        table.add_row(row.quantity, row.unit, row.value, row.pooled, row.requests)
    console.print(table)
    console.print(f"decoder: {describe_decoder(s.decoder)}", style="dim")
    console.print(f"verification: {s.verification.describe()}", style="dim")
    for note in notes(s):
        console.print(f"[yellow]note:[/] {note}")


def run_validate(args: argparse.Namespace) -> int:
    for log in args.logs:
        rows = validate(log)
        requests = read_requests(log, log_shape(log).M)
        if requests is None:
            print(f"{log}: ok, {rows:,} blocks (no request table)")
            continue
        run_tpf_of_log(tally_blocks(log), requests, draws=1)  # rows against their blocks
        print(f"{log}: ok, {rows:,} blocks, {len(requests):,} requests")
    return 0


def run_synth(args: argparse.Namespace) -> int:
    # checked before the writer creates the directory: a refused command writes nothing
    _need(args.blocks >= 1, "--blocks", "a number of blocks ≥ 1", args.blocks)
    _need(1 <= args.M <= 255, "--M", "proposal positions in 1..255", args.M)
    _need(2 <= args.K <= 4096, "--K", "candidates per position in 2..4096", args.K)
    _need(args.seed >= 0, "--seed", "an integer ≥ 0", args.seed)
    writer = synthetic_log(args.out, args.blocks, args.M, args.K, seed=args.seed)
    print(
        f"wrote {writer.rows_flushed:,} blocks of {writer.requests_written:,} requests to "
        f"{args.out}",
        file=sys.stdout,
    )
    return 0
