"""Ablation results as the paper shows them: a markdown table and a plot, intervals included.

The table has the shape of the paper's tab:ablation_breakdown (training data, weights, head,
accuracy, rejection, TPF, throughput), with brisk's additions: the mean accepted prefix, TPF
over the whole run beside TPF over complete cycles, and a 95 % interval across seeds in every
cell (``mean [low, high]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from brisk.mechanism.runs import COMPLETE_CYCLES, WHOLE_RUN
from brisk.runtime.experiment.evaluate import ArmSummary

__all__ = ["markdown_table", "plot_summaries"]

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
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
