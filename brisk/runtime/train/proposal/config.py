"""Configuration of proposal training (``brisk train proposal``): one frozen dataclass.

Loaded from TOML/JSON like :class:`~brisk.runtime.train.base.config.BaseTrainConfig` (unknown keys
are errors naming the key); the command line overrides single fields. The fields every training
config shares (seed, threads, the optimizer, placement, α) are declared once in
:mod:`brisk.runtime.train.fields`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brisk.runtime.train.fields import (
    BudgetSchedule,
    IDLMLoss,
    MaskToken,
    Placement,
    Run,
    at_least,
    one_of,
    positive,
)

__all__ = ["DATA_MODES", "PROFILE_MODES", "WEIGHT_SCHEMES", "ProposalTrainConfig"]

DataMode = Literal["selfgen-correct", "selfgen-all", "reference"]
WeightScheme = Literal["brisk", "uniform", "dpace", "decay"]
ProfileMode = Literal["dynamic", "static"]
DATA_MODES: tuple[str, ...] = ("selfgen-correct", "selfgen-all", "reference")
WEIGHT_SCHEMES: tuple[str, ...] = ("brisk", "uniform", "dpace", "decay")
PROFILE_MODES: tuple[str, ...] = ("dynamic", "static")


@dataclass(frozen=True)
class ProposalTrainConfig(Run, BudgetSchedule, Placement, IDLMLoss, MaskToken):
    """Continued I-DLM training with per-position proposal weights (eq:brisk_weighting).

    The run consumes ``token_budget`` response tokens (the same for every arm of an ablation,
    whatever the data's lengths); the learning rate follows warmup then cosine over that budget.
    """

    init: str = ""  # the checkpoint training starts from
    dataset: str = ""  # self-generated dataset (reference data uses its prompts)
    out_dir: str = "runs/proposal"
    data: DataMode = "selfgen-correct"
    weights: WeightScheme = "brisk"
    profile: ProfileMode = "dynamic"
    stride: int = 8  # N of the blocks the loss is laid out in (M = N − 1 proposal positions)
    token_budget: int = 200_000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    # The ISD rule the batch's own proposals are verified with (the deployed decoder's).
    temperature: float = 1.0
    top_k: int = 16
    profile_decay: float = 0.9  # ProfileTracker: an effective window of ~10 batches
    static_batches: int = 8  # batches the static profile is estimated on, before training
    gamma: float = 7.0  # DFlash decay constant
    log_every: int = 1
    save_every: int = 0  # steps between resumable checkpoints (0: only the final one)

    def __post_init__(self) -> None:
        at_least(self, 1, "token_budget", "batch_size", "log_every", "static_batches", "top_k")
        at_least(self, 0, "save_every")
        if self.stride < 2:
            raise ValueError(f"stride: need N ≥ 2, got {self.stride!r}")
        positive(self, "gamma")
        if not 0 <= self.profile_decay < 1:
            raise ValueError(f"profile_decay: must lie in [0, 1), got {self.profile_decay!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be ≥ 0, got {self.temperature!r}")
        one_of(self, "data", DATA_MODES)
        one_of(self, "weights", WEIGHT_SCHEMES)
        one_of(self, "profile", PROFILE_MODES)
        super().__post_init__()

    @property
    def M(self) -> int:
        return self.stride - 1
