"""The serving sweep's summary (:mod:`brisk.runtime.serving.bench` runs it).

Per (server, C), over the runs:

- **aggregate TPS**: generated tokens ÷ the run's duration, mean and 95 % t-interval;
- **median request TPS**: a request's tokens ÷ its end-to-end latency (first token + the inter-
  token gaps), median over every request of every run;
- **p95 latency**: 95th percentile of end-to-end request latency, pooled;
- **TPF**: the server's own counter as ``sglang.benchmark.serving`` reads it after the run
  (``/server_info``'s ``avg_spec_accept_length``): SGLang keeps it for speculative decoding, as
  an average over the server's lifetime (warm-up and earlier C included), and has none for dLLM
  algorithms, where the column stays empty.

Comparison (every later server against every earlier one, :func:`comparisons`): per C the
paired ratios B ÷ A of aggregate TPS, their geometric mean over runs with a
t-interval on the log scale; across C the geometric mean of the per-C ratios (the paper's
summary), its interval from the runs' own geometric means across C.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brisk._atomic import atomic_write
from brisk.mechanism.stats import Interval
from brisk.runtime.serving.bench import Run, ServeBenchOptions

__all__ = [
    "RatioRow",
    "SweepRow",
    "compare",
    "comparisons",
    "dumps",
    "markdown",
    "plot",
    "ratio_table",
    "summarize",
    "to_json",
]


@dataclass(frozen=True)
class SweepRow:
    server: str
    concurrency: int
    aggregate_tps: Interval
    median_request_tps: float
    p95_latency_s: float
    tpf: float | None
    runs: int


def summarize(runs: Sequence[Run]) -> list[SweepRow]:
    """One row per (server, C), in the order the runs came."""
    keys = list(dict.fromkeys((r.server, r.concurrency) for r in runs))
    rows = []
    for server, C in keys:
        group = [r for r in runs if (r.server, r.concurrency) == (server, C)]
        request_tps = [t for r in group for t in r.request_tps]
        e2e = [t for r in group for t in r.e2e_s]
        tpfs = [r.tpf for r in group if r.tpf is not None]
        rows.append(
            SweepRow(
                server=server,
                concurrency=C,
                aggregate_tps=Interval.of([r.aggregate_tps for r in group]),
                median_request_tps=statistics.median(request_tps) if request_tps else math.nan,
                p95_latency_s=float(np.percentile(e2e, 95)) if e2e else math.nan,
                tpf=statistics.fmean(tpfs) if tpfs else None,
                runs=len(group),
            )
        )
    return rows


@dataclass(frozen=True)
class RatioRow:
    concurrency: int | None  # None: the geometric mean across C
    ratio: Interval  # geometric mean of paired ratios, interval mapped back from the log scale
    pairs: int


def _geometric(logs: Sequence[float]) -> Interval:
    iv = Interval.of(logs)
    return Interval(math.exp(iv.mean), math.exp(iv.low), math.exp(iv.high), iv.k)


def compare(runs: Sequence[Run], baseline: str, candidate: str) -> list[RatioRow]:
    """Paired aggregate-TPS ratios candidate ÷ baseline per C, then their geometric mean across
    C (module doc). Runs pair by (C, run index)."""
    tps = {(r.server, r.concurrency, r.run): r.aggregate_tps for r in runs}
    Cs = list(dict.fromkeys(r.concurrency for r in runs))
    log_ratio: dict[tuple[int, int], float] = {}
    for (server, C, i), value in tps.items():
        if server == candidate and (baseline, C, i) in tps:
            log_ratio[C, i] = math.log(value / tps[baseline, C, i])
    if not log_ratio:
        raise ValueError(f"runs: no paired runs of {candidate!r} and {baseline!r}")
    indices = sorted({i for _, i in log_ratio})
    missing = [(C, i) for C in Cs for i in indices if (C, i) not in log_ratio]
    if missing:  # an across-C mean over fewer C would bias that run's summary
        C, i = missing[0]
        raise ValueError(
            f"runs: run {i} at C = {C} has no pair of {candidate!r} and "
            f"{baseline!r}; compare needs every (C, run) of both"
        )
    rows = []
    for C in Cs:
        logs = [v for (c, _), v in log_ratio.items() if c == C]
        if logs:
            rows.append(RatioRow(C, _geometric(logs), len(logs)))
    per_run = [
        statistics.fmean(log_ratio[C, i] for C in Cs if (C, i) in log_ratio) for i in indices
    ]
    rows.append(RatioRow(None, _geometric(per_run), len(per_run)))
    return rows


def markdown(rows: Sequence[SweepRow], ratios: Sequence[RatioRow] = (), names: str = "") -> str:
    lines = [
        "| server | C | aggregate TPS | median request TPS | p95 latency (s) | TPF | runs |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        tpf = "" if r.tpf is None else f"{r.tpf:.2f}"
        lines.append(
            f"| {r.server} | {r.concurrency} | {r.aggregate_tps.format(digits=1)} | "
            f"{r.median_request_tps:.1f} | {r.p95_latency_s:.3f} | {tpf} | {r.runs} |"
        )
    text = "\n".join(lines) + "\n"
    return text + ("\n" + ratio_table(ratios, names) if ratios else "")


def ratio_table(ratios: Sequence[RatioRow], names: str) -> str:
    """The paired ratios of one comparison (``names``: "B ÷ A") as a markdown table."""
    lines = [f"| C | TPS ratio {names} | pairs |", "|---:|---|---:|"]
    for q in ratios:
        c = "geomean over C" if q.concurrency is None else str(q.concurrency)
        lines.append(f"| {c} | {q.ratio.format(digits=3)} | {q.pairs} |")
    return "\n".join(lines) + "\n"


def comparisons(runs: Sequence[Run], labels: Sequence[str]) -> dict[str, list[RatioRow]]:
    """Every later server against every earlier one, ``"B ÷ A" → compare(runs, A, B)``, in
    the order of ``labels`` (A ÷ nothing for one server: empty)."""
    return {
        f"{b} ÷ {a}": compare(runs, a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]
    }


def to_json(
    runs: Sequence[Run],
    rows: Sequence[SweepRow],
    ratios: Sequence[RatioRow],
    options: ServeBenchOptions,
    servers: dict[str, str],
    more: dict[str, list[RatioRow]] | None = None,
) -> dict[str, Any]:
    """The document: ``ratios`` are the first comparison's (second ÷ first server), ``more``
    every comparison by name (:func:`comparisons`)."""
    return {
        "options": asdict(options),
        "servers": servers,
        "summary": [asdict(r) for r in rows],
        "ratios": [asdict(q) for q in ratios],
        "comparisons": {k: [asdict(q) for q in v] for k, v in (more or {}).items()},
        "runs": [asdict(r) for r in runs],
    }


def _null_nan(x: Any) -> Any:
    """NaN (an interval over one run) as JSON null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _null_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_null_nan(v) for v in x]
    return x


def dumps(document: dict[str, Any]) -> str:
    """Strict JSON (no NaN tokens) of :func:`to_json`'s document."""
    return json.dumps(_null_nan(document), indent=1, allow_nan=False)


def plot(
    rows: Sequence[SweepRow],
    ratios: Sequence[RatioRow] | dict[str, list[RatioRow]],
    path: Path,
    names: str = "",
) -> Path:
    """Aggregate TPS against C per server (95 % intervals), and the ratio per C of one
    comparison (``ratios`` named ``names``) or several (``{names: ratios}``); written
    atomically to ``path`` (PNG)."""
    pairs = dict(ratios) if isinstance(ratios, dict) else ({names: list(ratios)} if ratios else {})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = 2 if pairs else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    for server in dict.fromkeys(r.server for r in rows):
        mine = [r for r in rows if r.server == server]
        x = [r.concurrency for r in mine]
        y = [r.aggregate_tps.mean for r in mine]
        tps = [r.aggregate_tps for r in mine]
        below = [0.0 if math.isnan(t.low) else t.mean - t.low for t in tps]
        above = [0.0 if math.isnan(t.high) else t.high - t.mean for t in tps]
        err = [below, above]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=server)
    ax.set(xscale="log", xlabel="concurrency C", ylabel="aggregate tokens/s", title="serving sweep")
    ax.set_xticks([r.concurrency for r in rows], [str(r.concurrency) for r in rows])
    ax.minorticks_off()  # no "3 × 10⁰" between the concurrencies
    ax.legend()
    if pairs:
        ax = axes[0][1]
        for (name, ratio), color in zip(
            pairs.items(), plt.rcParams["axes.prop_cycle"], strict=False
        ):
            per_c = [q for q in ratio if q.concurrency is not None]
            below = [0.0 if math.isnan(q.ratio.low) else q.ratio.mean - q.ratio.low for q in per_c]
            above = [
                0.0 if math.isnan(q.ratio.high) else q.ratio.high - q.ratio.mean for q in per_c
            ]
            overall = ratio[-1].ratio.mean
            ax.errorbar(
                [q.concurrency for q in per_c],
                [q.ratio.mean for q in per_c],
                yerr=[below, above],
                marker="o",
                capsize=3,
                color=color["color"],
                label=f"{name} (geomean {overall:.3f})",
            )
            ax.axhline(overall, ls="--", color=color["color"], lw=0.8)
        ax.axhline(1.0, color="black", lw=0.5)
        ylabel = f"TPS ratio {next(iter(pairs))}" if len(pairs) == 1 else "paired TPS ratio"
        # ratios and their intervals live on the log scale (a wide interval stays readable)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="concurrency C",
            ylabel=ylabel,
            title="paired ratio (log scale)",
        )
        ax.set_xticks([q.concurrency for q in per_c], [str(q.concurrency) for q in per_c])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path
