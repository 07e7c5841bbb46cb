"""Time the analytic and autodiff progress weights on 1,000,000 profiles (M = 7), one core.

Target (issue 2): analytic weights for 1M profiles in ≤ 1 s on one core of the 2-core CPU
machine. Run: ``.venv/bin/python benchmarks/theory_bench.py``.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from brisk.theory import progress_weights, tpf


def best_of(repeats: int, fn: Callable[[], object]) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profiles", type=int, default=1_000_000)
    parser.add_argument("--M", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rng = np.random.default_rng(0)
    a = rng.uniform(0.3, 1.0, size=(args.profiles, args.M))
    a_torch = torch.from_numpy(a)

    t_analytic, w = best_of(args.repeats, lambda: progress_weights(a))
    t_torch, _ = best_of(args.repeats, lambda: progress_weights(a_torch))
    t_autodiff, w_ad = best_of(args.repeats, lambda: progress_weights(a, method="autodiff"))
    t_tpf, _ = best_of(args.repeats, lambda: tpf(a))
    max_diff = float(np.abs(np.asarray(w) - np.asarray(w_ad)).max())

    table = Table(title=f"{args.profiles:,} profiles, M = {args.M}, float64, 1 thread")
    for column in ("operation", "input", "best of", "seconds", "profiles / s"):
        table.add_column(column, justify="right" if column != "operation" else "left")
    rows = [
        ("progress_weights analytic", "numpy", t_analytic),
        ("progress_weights analytic", "torch", t_torch),
        ("progress_weights autodiff", "numpy", t_autodiff),
        ("tpf (ISD)", "numpy", t_tpf),
    ]
    for name, kind, seconds in rows:
        table.add_row(
            name, kind, str(args.repeats), f"{seconds:.3f}", f"{args.profiles / seconds:,.0f}"
        )
    console = Console()
    console.print(table)
    console.print(f"max |analytic − autodiff| over all weights: {max_diff:.2e}")
    verdict = "PASS" if t_analytic <= 1.0 else "FAIL"
    console.print(f"target analytic ≤ 1 s: {verdict} ({t_analytic:.3f} s)")
    console.print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"numpy {np.__version__}, python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
