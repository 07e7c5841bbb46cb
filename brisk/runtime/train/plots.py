"""Plots of a proposal-training run: the paper's fig:position_weight_evolution; and how every
figure of a run or an experiment is written (:func:`save_figure`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_weight_evolution", "save_figure"]


def save_figure(fig: Figure, path: str | Path) -> Path:
    """``fig`` laid out tight, written to ``path`` (a PNG at 120 dpi) and closed; returns the
    path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _smooth3(x: np.ndarray) -> np.ndarray:
    """Centered three-point moving average (the ends average what they have)."""
    padded = np.concatenate([x[:1], x, x[-1:]])
    out = (padded[:-2] + padded[1:-1] + padded[2:]) / 3
    if len(x) > 1:
        out[0], out[-1] = (x[0] + x[1]) / 2, (x[-2] + x[-1]) / 2
    return out


def plot_weight_evolution(metrics: str | Path, path: str | Path) -> Path:
    """The normalized position weights over training (fig:position_weight_evolution): early
    positions (1–3) and later ones (4–M) in separate panels with their own scales, faint logged
    values, a centered three-point moving average, and the uniform line w̄ = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logged = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line]
    records = [r for r in logged if r.get("event") == "train"]
    if not records:
        raise ValueError(f"{metrics}: no training records to plot")
    steps = np.array([r["step"] for r in records])
    w = np.array([r["weights"] for r in records])  # [T, M]
    M = w.shape[1]
    groups = [range(min(3, M)), range(3, M)] if M > 3 else [range(M)]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 3.6), squeeze=False)
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, M))
    for ax, group in zip(axes[0], groups, strict=True):
        for i in group:
            ax.plot(steps, w[:, i], color=colors[i], alpha=0.25, lw=0.8)
            ax.plot(steps, _smooth3(w[:, i]), color=colors[i], lw=1.8, label=f"w̄{i + 1}")
        ax.axhline(1.0, color="k", ls="--", lw=1, label="uniform")
        ax.set_xlabel("training step")
        ax.set_ylabel("normalized weight w̄ᵢ")
        ax.set_title(f"positions {group.start + 1}–{group.stop}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.suptitle("BRISK weight w̄_i of each proposal position over training")
    return save_figure(fig, path)
