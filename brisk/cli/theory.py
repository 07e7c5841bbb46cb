"""``brisk theory``: acceptance-profile arithmetic from the command line."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from brisk.cli._common import OneLineErrors, comma_separated
from brisk.theory.tpf import (
    CostModel,
    accept_length_pmf,
    expected_accept_length,
    fpt,
    survival,
    tpf,
)
from brisk.theory.weights import decay_weights, dpace_weights, progress_weights, uniform_weights


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("theory", help="TPF theory and progress weights")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=OneLineErrors
    )

    p = commands.add_parser("tpf", help="TPF, FPT, E[L], the pmf of L and the weights of a profile")
    p.add_argument(
        "--a",
        type=comma_separated(float, "numbers"),
        required=True,
        help="acceptance rates a_1..a_M in [0, 1], e.g. 0.9,0.8",
    )
    p.add_argument(
        "--cost", choices=("isd", "sd"), default="isd", help="ISD (default) or speculative decoding"
    )
    p.add_argument(
        "--draft-cost",
        type=float,
        default=0.0,
        help="drafter forward cost relative to the verifier, ≥ 0 (sd only)",
    )
    p.add_argument("--gamma", type=float, default=7.0, help="decay baseline's γ > 0 (DFlash: 7)")
    p.add_argument("--alpha", type=float, default=0.5, help="D-PACE smoothing α in [0, 1]")
    p.set_defaults(run=run_tpf)

    f = commands.add_parser("figure", help="write the paper's TPF-vs-rejection figure as PNG")
    f.add_argument("--stride", type=int, default=8, help=f"ISD stride N, 2..{MAX_STRIDE}")
    f.add_argument("--out", type=Path, required=True, help="output directory (created if needed)")
    f.set_defaults(run=run_figure)


MAX_STRIDE = 4096
"""Largest stride the figure accepts (its curve costs O(N) per point; the paper uses N = 8)."""


def _need(ok: bool, flag: str, want: str, got: object) -> None:
    """A one-line argument error (``brisk.cli.main`` prints it and exits with code 2)."""
    if not ok:
        raise ValueError(f"{flag}: need {want}, got {got}")


def _check_tpf_args(args: argparse.Namespace) -> None:
    for i, value in enumerate(args.a, 1):
        _need(0 <= value <= 1, "--a", "acceptance rates in [0, 1]", f"a_{i} = {value}")
    _need(
        math.isfinite(args.draft_cost) and args.draft_cost >= 0,
        "--draft-cost",
        "a finite cost ≥ 0",
        args.draft_cost,
    )
    if args.cost != "sd" and args.draft_cost != 0:
        raise ValueError(f"--draft-cost: only meaningful with --cost sd, got --cost {args.cost}")
    _need(math.isfinite(args.gamma) and args.gamma > 0, "--gamma", "a finite γ > 0", args.gamma)
    _need(0 <= args.alpha <= 1, "--alpha", "α in [0, 1]", args.alpha)


def run_tpf(args: argparse.Namespace) -> int:
    _check_tpf_args(args)
    a = np.asarray(args.a, dtype=np.float64)
    M = a.size
    cost = CostModel.speculative(M, args.draft_cost) if args.cost == "sd" else CostModel.isd(M)
    A, pmf = survival(a), accept_length_pmf(a)
    weights = {
        "BRISK w̄": progress_weights(a, cost),
        "D-PACE": dpace_weights(a, args.alpha),
        "decay": decay_weights(M, args.gamma),
        "uniform": uniform_weights(M),
    }
    label = "ISD" if args.cost == "isd" else f"speculative, draft cost {args.draft_cost:g}"
    console = Console()
    console.print(
        f"[bold]M = {M}[/] (stride N = {M + 1}), cost model: {label}\n"
        f"TPF = [bold]{float(tpf(a, cost)):.4f}[/]   FPT = {float(fpt(a, cost)):.4f}   "
        f"E[L] = {float(expected_accept_length(a)):.4f}"
    )
    table = Table("k", "a_k", "A_k", "P(L=k)", "g_k", "c_k", *weights, box=box.SIMPLE_HEAD)
    for k in range(M + 1):
        per_position = [f"{a[k - 1]:.3f}"] if k else ["—"]
        per_weight = [f"{w[k - 1]:.3f}" if k else "—" for w in weights.values()]
        table.add_row(
            str(k),
            *per_position,
            f"{A[k]:.3f}",
            f"{pmf[k]:.3f}",
            f"{cost.gains[k]:g}",
            f"{cost.costs[k]:g}",
            *per_weight,
        )
    console.print(table)
    console.print(
        "Weights are mean-one. D-PACE uses a_k in place of per-token drafter probabilities.",
        style="dim",
    )
    return 0


def _output_directory(out: Path) -> None:
    """Create ``out`` (and its parents), or say in one line why it cannot be a directory."""
    # the nearest existing path at or above --out decides: it must be a directory
    there = next(p for p in (out, *out.absolute().parents) if p.exists())
    if there == out:
        _need(out.is_dir(), "--out", "a directory", f"the file {out}")
    else:
        _need(there.is_dir(), "--out", "a path whose parents are directories", f"the file {there}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out: cannot create {out} ({err.strerror or err})") from None


def run_figure(args: argparse.Namespace) -> int:
    _need(
        2 <= args.stride <= MAX_STRIDE, "--stride", f"an integer N in 2..{MAX_STRIDE}", args.stride
    )
    _output_directory(args.out)
    import matplotlib

    matplotlib.use("Agg")
    from brisk.theory.plots import plot_tpf_vs_rejection

    path = args.out / f"tpf_vs_rejection_N{args.stride}.png"
    try:
        plot_tpf_vs_rejection(args.stride).savefig(path, dpi=150)
    except OSError as err:  # e.g. a read-only directory, or a directory where the PNG goes
        raise ValueError(f"--out: cannot write {path} ({err.strerror or err})") from None
    print(f"wrote {path}")
    return 0
