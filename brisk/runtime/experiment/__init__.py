"""Ablations: evaluate trained checkpoints in the paper's terms and report them across seeds."""

from __future__ import annotations

from brisk.runtime.experiment.evaluate import (
    ArmSummary,
    CheckpointEval,
    evaluate_checkpoint,
    summarize,
)
from brisk.runtime.experiment.table import markdown_table, plot_summaries

__all__ = [
    "ArmSummary",
    "CheckpointEval",
    "evaluate_checkpoint",
    "markdown_table",
    "plot_summaries",
    "summarize",
]
