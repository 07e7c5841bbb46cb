"""Ablation results as the paper shows them: a markdown table and a plot, intervals included.

The table has the shape of the paper's tab:ablation_breakdown (training data, weights, head,
accuracy, rejection, TPF, throughput), with brisk's additions: the mean accepted prefix, TPF
over the whole run beside TPF over complete cycles, and a 95 % interval across seeds in every
cell (``mean [low, high]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from brisk.experiments.evaluate import ArmSummary
from brisk.mechanism.runs import COMPLETE_CYCLES, WHOLE_RUN
from brisk.mechanism.stats import Interval

__all__ = ["DIRECTIONS", "directions_table", "markdown_table", "paired_change", "plot_summaries"]

COLUMNS = (  # (metric, header, scale, digits)
    ("accuracy", "Acc. (%)", 100.0, 1),
    ("rejection", "Reject (%)", 100.0, 2),
    ("accept_length", "E[L]", 1.0, 2),
    ("tpf_run", WHOLE_RUN, 1.0, 2),
    ("tpf_cycles", COMPLETE_CYCLES, 1.0, 2),
    ("tokens_per_s", "tok/s (CPU)", 1.0, 0),
)


def markdown_table(
    summaries: Sequence[ArmSummary],
    labels: Mapping[str, Sequence[str]] | None = None,
    label_headers: Sequence[str] = ("Arm",),
    baseline: str | None = None,
) -> str:
    """One row per arm. ``labels[arm]`` fills the ``label_headers`` columns (default: the arm's
    name). With ``baseline``, a last column gives each arm's whole-run TPF change against it
    (ratio of the seed means). Arms whose grader raised are named below the table with the count
    of answers it counted wrong that way."""
    means = {s.arm: s.metrics["tpf_run"].mean for s in summaries}
    if baseline is not None and baseline not in means:
        raise ValueError(f"baseline: no arm named {baseline!r} (arms: {', '.join(means)})")
    headers = [*label_headers, *(h for _, h, _, _ in COLUMNS), "seeds"]
    if baseline is not None:
        headers.append(f"ΔTPF vs {baseline}")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for s in summaries:
        names = list(labels[s.arm]) if labels is not None else [s.arm]
        if len(names) != len(label_headers):
            raise ValueError(
                f"labels: arm {s.arm!r} has {len(names)} labels for {len(label_headers)} columns"
            )
        cells = [*names]
        cells += [s.metrics[m].format(scale, digits) for m, _, scale, digits in COLUMNS]
        cells.append(str(len(s.seeds)))
        if baseline is not None:
            cells.append(f"{100 * (means[s.arm] / means[baseline] - 1):+.1f} %")
        lines.append("| " + " | ".join(cells) + " |")
    errors = [f"{s.arm} {s.grader_errors}" for s in summaries if s.grader_errors]
    if errors:
        lines += ["", f"Grader errors (answers counted wrong): {', '.join(errors)}."]
    return "\n".join(lines) + "\n"


def plot_summaries(summaries: Sequence[ArmSummary], path: str | Path) -> Path:
    """Whole-run TPF and accuracy per arm, seed means with their intervals, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from brisk.runtime.train.plots import save_figure

    arms = [s.arm for s in summaries]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(arms) + 1.5), sharey=True)
    for ax, (metric, title, scale) in zip(
        axes,
        [("tpf_run", WHOLE_RUN, 1.0), ("accuracy", "accuracy (%)", 100.0)],
        strict=True,
    ):
        iv = [s.metrics[metric] for s in summaries]
        mean = [i.mean * scale for i in iv]
        err = [
            [(i.mean - i.low) * scale if i.k > 1 else 0 for i in iv],
            [(i.high - i.mean) * scale if i.k > 1 else 0 for i in iv],
        ]
        ax.barh(range(len(arms)), mean, xerr=err, color="tab:blue", alpha=0.75, capsize=3)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(arms)), arms)
    axes[0].invert_yaxis()
    fig.suptitle("seed means with 95 % t-intervals")
    return save_figure(fig, path)


# The paper's directions for the proposal ablation: (claim, numerator arm, denominator arm), the
# arms without their budget; ``+head`` is the head-on row of the arm the experiment chose.
DIRECTIONS: tuple[tuple[str, str, str], ...] = (
    ("self-generated data beats reference data", "selfgen-all-dynamic", "reference-dynamic"),
    ("BRISK training alone (head off)", "selfgen-correct-dynamic", "base"),
    ("the whole method: training + head", "+head", "base"),
    ("dynamic beats uniform weights", "selfgen-correct-dynamic", "selfgen-correct-uniform"),
    ("static BRISK weights", "selfgen-correct-static", "selfgen-correct-uniform"),
    ("D-PACE weights", "selfgen-correct-dpace", "selfgen-correct-uniform"),
    ("decay weights", "selfgen-correct-decay", "selfgen-correct-uniform"),
    ("dynamic against D-PACE", "selfgen-correct-dynamic", "selfgen-correct-dpace"),
    ("the head on top of training", "+head", "+head-arm"),
    ("correct-only self-generated data", "selfgen-correct-dynamic", "selfgen-all-dynamic"),
)


def paired_change(values: Mapping[tuple[str, int], float], num: str, den: str) -> Interval | None:
    """The change of ``num`` against ``den`` paired per seed (the arms of seed s share the
    decode seeds): the mean log-ratio over the seeds both have, with its Student-t interval,
    as fractions (``exp(x) − 1``). None when no seed has both.

    >>> v = {("a", 0): 1.1, ("a", 1): 1.2, ("b", 0): 1.0, ("b", 1): 1.0}
    >>> round(paired_change(v, "a", "b").mean, 4)
    0.1489
    """
    seeds = sorted(s for (arm, s) in values if arm == num and (den, s) in values)
    if not seeds:
        return None
    iv = Interval.of([math.log(values[(num, s)] / values[(den, s)]) for s in seeds])
    return Interval(*(math.expm1(x) for x in (iv.mean, iv.low, iv.high)), iv.k)


def directions_table(
    evals: Sequence[Mapping[str, Any]], head_arm: str | None, metric: str = "tpf_run"
) -> str:
    """The paper's directions (:data:`DIRECTIONS`) at every budget the arms were trained for:
    the paired change of ``metric`` (whole-run TPF) with its interval, and whether the interval
    lies above zero (each claim's direction in the paper), below it, or around it. ``evals``: the
    experiment's evaluations as dicts (``arm``, ``seed``, the metric); ``head_arm``: the arm
    under the head-on row."""
    values = {(e["arm"], int(e["seed"])): float(e[metric]) for e in evals}
    arms = {arm for arm, _ in values}
    # "" when the arms were trained for one unnamed budget (no "@" in their names)
    budgets = sorted({a.split("@", 1)[1] for a in arms if "@" in a and "+" not in a}) or [""]

    def job(name: str, budget: str) -> str | None:
        at = f"@{budget}" if budget else ""
        if name in ("+head", "+head-arm"):
            if head_arm is None or not head_arm.endswith(at):
                return None
            return f"{head_arm}+head" if name == "+head" else head_arm
        return name if name == "base" else name + at

    lines = [
        "| direction | comparison | budget | change of TPF [95 % CI] | seeds | verdict |",
        "|---|---|---|---:|---:|---|",
    ]
    for claim, num, den in DIRECTIONS:
        for budget in budgets:
            a, b = job(num, budget), job(den, budget)
            change = paired_change(values, a, b) if a and b else None
            if change is None:
                continue
            if change.k > 1 and change.low > 0:
                verdict = "above zero"
            elif change.k > 1 and change.high < 0:
                verdict = "below zero"
            else:
                verdict = "not distinguishable from zero"
            cell = f"{100 * change.mean:+.1f} %"
            if change.k > 1:
                cell += f" [{100 * change.low:+.1f}, {100 * change.high:+.1f}]"
            budget_cell = budget or "–"
            lines.append(
                f"| {claim} | {a} ÷ {b} | {budget_cell} | {cell} | {change.k} | {verdict} |"
            )
    return "\n".join(lines) + "\n"
