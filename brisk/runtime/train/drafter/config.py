"""Configuration of drafter training (``brisk train drafter``): one frozen dataclass, read from
TOML or JSON like the other training configs (unknown keys are errors naming the key).

The drafter learns from its target's own regenerated responses: a dataset made by ``brisk
train selfgen --checkpoint TARGET`` (the target decodes with exact verification, so its
responses follow the target's own law; the correctness filter is the task's grader). Every
weighting trains on ``token_budget`` drafted targets, so the arms of an experiment spend the
same budget.

Where it runs are the fields every training command shares
(:class:`~brisk.runtime.train.fields.DataParallel`): ``device``, ``precision`` (the target and
the drafter keep fp32 weights; ``bf16`` computes in bfloat16), and under torchrun ``fsdp`` and
``micro_batch_size``; ``batch_size`` is the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from brisk.runtime.train.fields import (
    BudgetSchedule,
    DataParallel,
    MaskId,
    Run,
    at_least,
    one_of,
    positive,
)

__all__ = ["DATA", "DrafterTrainConfig"]

Data = Literal["selfgen-correct", "selfgen-all"]
DATA: tuple[Data, ...] = get_args(Data)
Weighting = Literal["brisk", "dpace", "decay", "uniform"]  # the position-weighting schemes
WEIGHTINGS: tuple[Weighting, ...] = get_args(Weighting)


@dataclass(frozen=True)
class DrafterTrainConfig(Run, BudgetSchedule, DataParallel, MaskId):
    """A DFlash-shaped drafter for ``target`` trained on ``dataset`` with ``weighting``."""

    target: str = ""  # the AR target checkpoint (an HF causal LM)
    dataset: str = ""  # the target's regenerated responses (brisk train selfgen)
    out_dir: str = "runs/drafter"
    data: Data = "selfgen-correct"
    weighting: Weighting = "brisk"
    num_layers: int = 1  # drafter decoder layers
    block_size: int = 8  # anchor + M = block_size − 1 proposals
    target_layer_ids: tuple[int, ...] = ()  # empty: DFlash's default spread
    anchors: int = 32  # blocks per sequence per step
    token_budget: int = 100_000  # drafted targets trained on
    batch_size: int = 16  # responses per step: the global batch, split over torchrun ranks
    alpha: float = 0.5  # D-PACE's smoothing
    gamma: float = 7.0  # DFlash's decay
    profile_decay: float = 0.9  # the BRISK profile tracker's (about 10 batches)
    eval_problems: int = 32  # prompts of the dataset's task (test split) decoded at the end
    eval_max_new_tokens: int = 128
    log_every: int = 10
    save_every: int = 0  # steps between resumable checkpoints (0: only the final one)
    # a directory for the frozen target's features of the dataset, computed once and shared by
    # every run with the same target, dataset and layers (empty: a target forward every step)
    feature_cache: str = ""

    def __post_init__(self) -> None:
        at_least(self, 1, "num_layers", "anchors", "token_budget", "batch_size", "log_every")
        at_least(self, 0, "save_every", "eval_problems")
        at_least(self, 2, "block_size")
        at_least(self, 1, "eval_max_new_tokens")
        positive(self, "gamma")
        one_of(self, "data", DATA)
        one_of(self, "weighting", WEIGHTINGS)
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"alpha: must lie in [0, 1], got {self.alpha!r}")
        if not 0 <= self.profile_decay < 1:
            raise ValueError(f"profile_decay: must lie in [0, 1), got {self.profile_decay!r}")
        super().__post_init__()

    @property
    def M(self) -> int:
        return self.block_size - 1
