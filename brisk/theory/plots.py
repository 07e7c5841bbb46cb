"""Figures for the theory layer (matplotlib is imported on first use, not with the package)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from brisk.theory.tpf import CostModel, isd_tpf_uniform
from brisk.theory.weights import decay_weights, dpace_weights, progress_weights, uniform_weights

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_tpf_vs_rejection", "plot_weights"]


def plot_tpf_vs_rejection(
    stride: int = 8, marks: Sequence[float] = (0.10, 0.15, 0.20), max_rejection: float = 0.5
) -> Figure:
    """The paper's fig:tpf_rejection: ISD tokens per forward against a uniform rejection rate
    (:func:`~brisk.theory.tpf.isd_tpf_uniform`)."""
    import matplotlib.pyplot as plt

    r = np.linspace(0.0, max_rejection, 501)
    fig, ax = plt.subplots(figsize=(4.6, 3.4), layout="constrained")
    ax.plot(100 * r, isd_tpf_uniform(r, stride), color="C0", lw=2)
    ax.axhline(stride, color="0.6", ls=":", lw=1, label=f"nominal N = {stride}")
    for mark in marks:
        value = float(isd_tpf_uniform(mark, stride))
        ax.plot(100 * mark, value, "o", color="C3")
        ax.annotate(f"{value:.2f}", (100 * mark, value), xytext=(6, 6), textcoords="offset points")
    ax.set_xlabel("per-position rejection rate r (%)")
    ax.set_ylabel("tokens per forward")
    ax.set_title(f"Rejection limits effective parallelism (ISD, N = {stride})")
    ax.set_ylim(0, stride + 0.5)
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    return fig


def plot_weights(
    profiles: Mapping[str, Sequence[float]],
    cost: CostModel | None = None,
    gamma: float = 7.0,
    alpha: float = 0.5,
) -> Figure:
    """BRISK weights beside D-PACE, decay and uniform, one panel per named profile.

    D-PACE needs per-token drafter probabilities; the acceptance rate a_i stands in for them.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(profiles), figsize=(4.2 * len(profiles), 3.4), layout="constrained", squeeze=False
    )
    for ax, (name, a) in zip(axes[0], profiles.items(), strict=True):
        a_arr = np.asarray(a, dtype=np.float64)
        M = a_arr.size
        positions = np.arange(1, M + 1)
        series = {
            "BRISK": progress_weights(a_arr, cost),
            "D-PACE": dpace_weights(a_arr, alpha),
            f"decay γ={gamma:g}": decay_weights(M, gamma),
        }
        width = 0.8 / len(series)
        for j, (label, w) in enumerate(series.items()):
            ax.bar(positions + (j - 1) * width, w, width, label=label)
        ax.plot(positions, uniform_weights(M), color="0.4", ls="--", lw=1, label="uniform")
        twin = ax.twinx()
        twin.plot(positions, a_arr, "k.-", label="a_i")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("acceptance a_i")
        ax.set_xticks(positions)
        ax.set_xlabel("proposal position i")
        ax.set_ylabel("mean-one weight")
        ax.set_title(name)
        twin.legend(loc="lower left", frameon=False, fontsize="small")
    axes[0][-1].legend(loc="upper left", frameon=False, fontsize="small")
    return fig
