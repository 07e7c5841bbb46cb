"""Configuration of proposal training (``brisk train proposal``): one frozen dataclass.

Loaded from TOML/JSON like :class:`~brisk.runtime.train.config.BaseTrainConfig` (unknown keys
are errors naming the key); the command line overrides single fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brisk.runtime.configs import Config

__all__ = ["DATA_MODES", "PROFILE_MODES", "WEIGHT_SCHEMES", "ProposalTrainConfig"]

DataMode = Literal["selfgen-correct", "selfgen-all", "reference"]
WeightScheme = Literal["brisk", "uniform", "dpace", "decay"]
ProfileMode = Literal["dynamic", "static"]
DATA_MODES: tuple[str, ...] = ("selfgen-correct", "selfgen-all", "reference")
WEIGHT_SCHEMES: tuple[str, ...] = ("brisk", "uniform", "dpace", "decay")
PROFILE_MODES: tuple[str, ...] = ("dynamic", "static")


@dataclass(frozen=True)
class ProposalTrainConfig(Config):
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
    seed: int = 0
    stride: int = 8  # N of the blocks the loss is laid out in (M = N − 1 proposal positions)
    token_budget: int = 200_000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: float = 0.05  # share of the budget spent warming up
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    alpha: float | Literal["auto"] = "auto"
    # The ISD rule the batch's own proposals are verified with (the deployed decoder's).
    temperature: float = 1.0
    top_k: int = 16
    profile_decay: float = 0.9  # ProfileTracker: an effective window of ~10 batches
    static_batches: int = 8  # batches the static profile is estimated on, before training
    gamma: float = 7.0  # DFlash decay constant
    random_block_offset: bool = True
    # the training mask: dense [2L, 2L], or its FlexAttention BlockMask twin (flex-compiled: CUDA)
    attention: Literal["dense", "flex", "flex-compiled"] = "dense"
    fsdp: bool = False  # FSDP2 shards instead of DDP replicas (under torchrun)
    # where one process trains: cpu, cuda, cuda:1 (auto: the GPU where one exists); under
    # torchrun each rank trains on its own GPU (LOCAL_RANK) or the CPU
    device: str = "auto"
    # bf16: bf16 compute, fp32 weights and reductions (auto: bf16 on a GPU, fp32 on the CPU)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    activation_checkpointing: bool = False  # recompute each decoder layer in the backward
    micro_batch_size: int = 0  # rows per forward on a rank, accumulated (0: its whole share)
    log_every: int = 1
    save_every: int = 0  # steps between resumable checkpoints (0: only the final one)
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("token_budget", "batch_size", "log_every", "threads", "static_batches",
                     "top_k"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)!r}")
        for name in ("save_every", "micro_batch_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)!r}")
        if self.stride < 2:
            raise ValueError(f"stride: need N ≥ 2, got {self.stride!r}")
        for name in ("lr", "grad_clip", "gamma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"min_lr: need 0 < min_lr ≤ lr ({self.lr!r}), got {self.min_lr!r}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup: must lie in [0, 1), got {self.warmup!r}")
        if not 0 <= self.profile_decay < 1:
            raise ValueError(f"profile_decay: must lie in [0, 1), got {self.profile_decay!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be ≥ 0, got {self.temperature!r}")
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ValueError(f"alpha: expected a number ≥ 0 or 'auto', got {self.alpha!r}")
        for name, allowed in (("data", DATA_MODES), ("weights", WEIGHT_SCHEMES),
                              ("profile", PROFILE_MODES), ("precision", ("auto", "fp32", "bf16")),
                              ("attention", ("dense", "flex", "flex-compiled"))):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}: expected one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )

    @property
    def M(self) -> int:
        return self.stride - 1

    def lr_at(self, progress: float) -> float:
        """Linear warmup over ``warmup`` of the budget, then cosine from ``lr`` to ``min_lr``."""
        import math

        if progress < self.warmup:
            return self.lr * max(progress / self.warmup, 1e-3)
        t = min((progress - self.warmup) / (1 - self.warmup), 1.0)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * t))
