"""``brisk theory``: acceptance-profile arithmetic from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from brisk._cli import comma_separated
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
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("tpf", help="TPF, FPT, E[L], the pmf of L and the weights of a profile")
    p.add_argument(
        "--a",
        type=comma_separated(float, "numbers"),
        required=True,
        help="acceptance rates a_1..a_M, e.g. 0.9,0.8",
    )
    p.add_argument(
        "--cost", choices=("isd", "sd"), default="isd", help="ISD (default) or speculative decoding"
    )
    p.add_argument(
        "--draft-cost",
        type=float,
        default=0.0,
        help="drafter forward cost relative to the verifier (sd only)",
    )
    p.add_argument("--gamma", type=float, default=7.0, help="decay baseline's γ (DFlash: 7)")
    p.add_argument("--alpha", type=float, default=0.5, help="D-PACE smoothing α")
    p.set_defaults(run=run_tpf)

    f = commands.add_parser("figure", help="write the paper's Figure 2 (TPF vs rejection) as PNG")
    f.add_argument("--stride", type=int, default=8, help="ISD stride N")
    f.add_argument("--out", type=Path, required=True, help="output directory")
    f.set_defaults(run=run_figure)


def run_tpf(args: argparse.Namespace) -> int:
    a = np.asarray(args.a, dtype=np.float64)
    M = a.size
    if args.cost == "sd":
        cost = CostModel.speculative(M, args.draft_cost)
    elif args.draft_cost:
        raise ValueError("--draft-cost: only meaningful with --cost sd")
    else:
        cost = CostModel.isd(M)
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


def run_figure(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from brisk.theory.plots import plot_tpf_vs_rejection

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tpf_vs_rejection_N{args.stride}.png"
    plot_tpf_vs_rejection(args.stride).savefig(path, dpi=150)
    print(f"wrote {path}")
    return 0
