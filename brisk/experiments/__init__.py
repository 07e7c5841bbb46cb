"""The experiments: the ablations behind the paper's results, apart from the library.

Each one (``brisk experiment proposal|corrector|drafter``) trains and evaluates checkpoints with
:mod:`brisk.runtime` in the paper's terms and reports them across seeds: its config
(``proposal_config``, ``corrector_config``, ``drafter_config``), its runner (``proposal``,
``corrector``, ``drafter``) and its tables. They sit above the runtime, which never imports them.
"""

from __future__ import annotations

from brisk.experiments.evaluate import (
    ArmSummary,
    CheckpointEval,
    Decoding,
    evaluate_checkpoint,
    summarize,
)
from brisk.experiments.table import markdown_table, plot_summaries

__all__ = [
    "ArmSummary",
    "CheckpointEval",
    "Decoding",
    "evaluate_checkpoint",
    "markdown_table",
    "plot_summaries",
    "summarize",
]
