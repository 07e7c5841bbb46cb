"""Figures of the mechanism report (matplotlib is imported on first use).

Every rate is drawn as its equal-request estimate with the bootstrap interval as an error bar;
empty populations (no first breakers at a position, say) are left out rather than drawn as 0,
and a panel with nothing to draw says why in its axes (``no corrector in this log`` for the
head's panels of a head-off log) instead of showing empty axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from brisk.mechanism.runs import ALL_ROUNDS, COMPLETE_CYCLES, WHOLE_RUN
from brisk.mechanism.stats import Mean, Rate, RateArray
from brisk.mechanism.summary import MechanismSummary

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_acceptance_profile",
    "plot_coverage",
    "plot_positions",
    "plot_repetition",
    "save_plots",
]


def _say(ax: Axes, text: str) -> None:
    """Write ``text`` in the middle of an axes that has no data (and drop its value ticks)."""
    ax.text(
        0.5,
        0.5,
        text,
        transform=ax.transAxes,
        ha="center",
        va="center",
        wrap=True,
        fontsize=9,
        color="0.35",
    )
    ax.set_yticks([])


def _rate_line(ax: Axes, x: np.ndarray, r: RateArray, color: str, label: str | None = None) -> bool:
    """Draw the finite rates of ``r``; return whether there were any."""
    ok = np.isfinite(r.equal_request)
    if not ok.any():
        return False
    y = 100 * r.equal_request[ok]
    err = None
    if np.isfinite(r.low[ok]).all():
        err = np.abs(np.vstack([y - 100 * r.low[ok], 100 * r.high[ok] - y]))
    ax.errorbar(x[ok], y, yerr=err, color=color, marker="o", capsize=3, lw=1.8, label=label)
    return True


def _paired_bars(
    ax: Axes,
    groups: Sequence[tuple[Rate | Mean, Rate | Mean]],
    series: tuple[tuple[str, str], tuple[str, str]],
    scale: float,
    names: Sequence[str],
    ylabel: str,
) -> None:
    """Two bars per group (series 0 and 1, each (label, color)) with their intervals, the
    groups named ``names`` on the x axis, ``ylabel`` on the y axis, a legend and a grid."""
    width = 0.36
    for j, (label, color) in enumerate(series):
        y = np.array([scale * g[j].equal_request for g in groups])
        bounds = np.array([[scale * g[j].low for g in groups], [scale * g[j].high for g in groups]])
        x = np.arange(len(groups)) + (j - 0.5) * width
        ax.bar(x, y, width, yerr=np.abs(bounds - y), capsize=3, color=color, label=label)
    ax.set_xticks(np.arange(len(groups)), names)
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False)
    ax.grid(axis="y", alpha=0.3)


def _compact(n: int) -> str:
    """5,970 / 113k / 1.2M: short enough to sit under a point."""
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.0f}k" if n >= 10_000 else f"{n:,}"


def plot_positions(s: MechanismSummary) -> Figure:
    """Per-position intervention, rescue and regression: the paper's
    fig:mech_first_breaker_position and its regression companion."""
    import matplotlib.pyplot as plt

    rep = s.replay
    x = np.arange(1, s.shape.M + 1)
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.4), layout="constrained")
    # (rates, color, title, y label, population of the denominator)
    panels = [
        (
            rep.intervention_by_position,
            "C0",
            "(a) head intervention",
            "% of first breakers",
            "first breakers",
        ),
        (
            rep.rescue_by_position,
            "C2",
            "(b) same-draw rescue",
            "per 100 first breakers",
            "first breakers",
        ),
        (
            rep.regression_by_position,
            "C3",
            "(c) introduced rejection",
            "per 100 accepted positions",
            "accepted positions",
        ),
    ]
    gap = s.head_gap("head_choice")
    drawn = []
    for ax, (rates, color, title, ylabel, population) in zip(axes, panels, strict=True):
        ax.set_title(title)
        ax.set_xlabel("proposal position i")
        ax.set_xticks(x)
        drawn.append(gap is None and _rate_line(ax, x, rates, color))
        if not drawn[-1]:
            ax.set_xlim(0.5, s.shape.M + 0.5)
            _say(ax, gap or f"no {population} where the head ran")
            continue
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    if drawn[0]:
        for xi, c in zip(x, rep.first_breakers_by_position, strict=True):
            axes[0].annotate(
                _compact(int(c)),
                (xi, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="0.45",
            )
        axes[0].text(
            0.02,
            0.97,
            "grey: first breakers at i",
            transform=axes[0].transAxes,
            va="top",
            fontsize=7,
            color="0.45",
        )
    fig.suptitle(
        f"First-breaker repair by position ({s.n_requests:,} requests, equal-request "
        f"means, {round(100 * s.level)}% bootstrap CI)",
        fontsize=10,
    )
    return fig


def plot_repetition(s: MechanismSummary) -> Figure:
    """Repeat prevalence (verified positions vs first breakers; the paper's fig:mech_collision)
    and repeats per block (app:mech_collision)."""
    import matplotlib.pyplot as plt

    r = s.repetition
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.5, 3.4), layout="constrained")
    names = ["adjacent", "non-adjacent"]
    groups = [
        (r.adjacent_verified, r.adjacent_first_breakers),
        (r.nonadjacent_verified, r.nonadjacent_first_breakers),
    ]
    series = (("verified positions", "C0"), ("first breakers", "C3"))
    _paired_bars(ax, groups, series, 100, names, "% of positions (equal-request)")
    ax.set_title("Repeat prevalence")
    bx.set_title(f"Repeats per block ({r.paired_blocks:,} paired blocks)")
    if (gap := s.head_gap("head_block")) is not None:
        bx.set_xticks([])
        _say(bx, gap)
        return fig
    means = [
        (r.adjacent_per_block_base, r.adjacent_per_block_head),
        (r.nonadjacent_per_block_base, r.nonadjacent_per_block_head),
    ]
    series = (("base block", "C7"), ("head block", "C2"))
    _paired_bars(bx, means, series, 1, names, "repeated tokens per block")
    return fig


def plot_coverage(s: MechanismSummary) -> Figure:
    """The coverage/mass columns of the paper's tab:topk_main for every K': verifier top-1
    coverage, its probability mass, and the verifier's mass on the candidates."""
    import matplotlib.pyplot as plt

    c = s.coverage
    x = np.arange(1, s.shape.K + 1)
    fig, ax = plt.subplots(figsize=(5.2, 3.6), layout="constrained")
    for rates, color, label in (
        (c.coverage, "C0", "top-1 coverage"),
        (c.mass, "C1", "top-1 mass"),
        (c.set_mass, "C7", "verifier mass on C"),
    ):
        y = 100 * rates.equal_request
        ax.plot(x, y, color=color, marker=".", label=label)
        if np.isfinite(rates.low).all():
            ax.fill_between(x, 100 * rates.low, 100 * rates.high, color=color, alpha=0.2, lw=0)
    for k in s.ks:
        ax.axvline(k, color="0.7", ls=":", lw=1)
        ax.annotate(
            f"{100 * c.coverage.equal_request[k - 1]:.1f}",
            (k, 100 * c.coverage.equal_request[k - 1]),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=8,
            color="C0",
        )
    ax.set_xlabel("candidate set size K'")
    ax.set_ylabel("% at first breakers")
    ax.set_title(f"Candidate availability ({c.first_breakers:,} first breakers)")
    ax.set_xticks(x if s.shape.K <= 16 else np.linspace(1, s.shape.K, 9).astype(int))
    ax.legend(frameon=False, loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def plot_acceptance_profile(s: MechanismSummary) -> Figure:
    """a_i with Jeffreys intervals, and the run's TPFs (:func:`tpf_caption`)."""
    import matplotlib.pyplot as plt

    a = s.profile.rates()
    lo, hi = s.profile.interval(s.level)
    x = np.arange(1, s.shape.M + 1)
    fig, ax = plt.subplots(figsize=(5.2, 3.6), layout="constrained")
    ok = np.isfinite(a)
    ax.errorbar(
        x[ok],
        a[ok],
        yerr=np.abs(np.vstack([a[ok] - lo[ok], hi[ok] - a[ok]])),
        marker="o",
        capsize=3,
        color="C0",
    )
    ax.set_ylim(min(0.5, float(np.nanmin(lo))) - 0.02 if ok.any() else 0, 1.01)
    ax.set_xticks(x)
    ax.set_xlabel("proposal position i")
    ax.set_ylabel("acceptance a_i (reached blocks)")
    ax.set_title(f"Acceptance profile, every logged verify round\n{tpf_caption(s)}", fontsize=9)
    ax.grid(alpha=0.3)
    return fig


def tpf_caption(s: MechanismSummary) -> str:
    """The run's TPFs in the words of the report table (:mod:`brisk.mechanism.runs`)."""
    if s.run is None:
        t = s.tpf
        return f"{ALL_ROUNDS} {t.estimate:.2f} [{t.low:.2f}, {t.high:.2f}]"
    r = s.run
    text = f"{WHOLE_RUN} {r.whole_run:.2f}, {COMPLETE_CYCLES.removeprefix('TPF, ')} "
    return text + f"{r.complete_cycles:.2f}"


def save_plots(s: MechanismSummary, out: Path) -> list[Path]:
    """Write the four PNGs; return their paths."""
    import matplotlib.pyplot as plt

    paths = []
    for name, make in (
        ("positions", plot_positions),
        ("repetition", plot_repetition),
        ("coverage", plot_coverage),
        ("acceptance_profile", plot_acceptance_profile),
    ):
        fig = make(s)
        path = out / f"{name}.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        paths.append(path)
    return paths
