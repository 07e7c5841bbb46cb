"""Configuration of AR pre-training (``brisk train ar``): one frozen
:class:`~brisk.runtime.configs.Config`, torch-free so the command line reads it cheaply.

A config file mirrors the dataclass; ``[corpus]`` (with ``[corpus.target]``, the target world)
and ``[model]`` fill the nested configs. Unknown keys are an error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from brisk.runtime.configs import Config
from brisk.runtime.tiny.broad import BroadConfig
from brisk.runtime.tiny.model import TinyModelConfig

__all__ = ["PretrainConfig"]


@dataclass(frozen=True)
class PretrainConfig(Config):
    """AR pre-training of the tiny preset on the broad corpus (:mod:`brisk.runtime.train.pretrain`
    has the objective and the loop)."""

    out_dir: str = "runs/converted/ar"
    seed: int = 0
    corpus: BroadConfig = field(default_factory=BroadConfig)
    model: TinyModelConfig = field(default_factory=lambda: TinyModelConfig(max_positions=256))
    steps: int = 1800
    batch_size: int = 32
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    log_every: int = 25
    save_every: int = 500
    # held-out problems of the target world decoded greedily after training (0: none)
    final_eval_problems: int = 200
    eval_seed: int = 1  # which held-out problems (the target world's test split)
    # One thread: on a shared 2-core machine two OpenMP threads oversubscribe and run slower.
    threads: int = 1
    max_minutes: float = 16.0  # wall-clock budget; training stops early and saves when exceeded

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "save_every", "final_eval_problems", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)!r}")
        for name in ("lr", "grad_clip", "max_minutes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"min_lr: need 0 < min_lr ≤ lr ({self.lr!r}), got {self.min_lr!r}")

    @classmethod
    def converted(cls) -> PretrainConfig:
        """The preset behind ``configs/converted_pretrain.toml``."""
        return cls()

    @classmethod
    def smoke(cls, out_dir: str = "runs/smoke_ar") -> PretrainConfig:
        """A few seconds with the micro model (the test suite's budget)."""
        return cls(out_dir=out_dir, model=TinyModelConfig.micro(), steps=60, batch_size=16,
                   warmup_steps=5, log_every=5, save_every=0,
                   final_eval_problems=0)  # fmt: skip
