"""Configuration of AR pre-training (``brisk train ar``): one frozen
:class:`~brisk.runtime.configs.Config`, torch-free so the command line reads it cheaply.

A config file mirrors the dataclass; ``[corpus]`` names a registered task whose corpus is
trained on (by default the arithmetic world's ``broad`` mixture, with ``[corpus.target]`` its
target world; its held-out problems are the target's) and ``[model]`` a model preset, each with
its settings. Unknown keys are an error naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from brisk.runtime.presets import NamedModel
from brisk.runtime.tasks.task import NamedTask
from brisk.runtime.train.base.config import StepRun
from brisk.runtime.train.fields import at_least

__all__ = ["PretrainConfig"]


@dataclass(frozen=True)
class PretrainConfig(StepRun):
    """AR pre-training of a model preset on a task's corpus
    (:mod:`brisk.runtime.train.pretrain.recipe` has the objective and the loop)."""

    out_dir: str = "runs/converted/ar"
    corpus: NamedTask = field(default_factory=lambda: NamedTask.named("broad"))
    model: NamedModel = field(default_factory=lambda: NamedModel.named("tiny", max_positions=256))
    steps: int = 1800
    batch_size: int = 32
    max_minutes: float = 16.0

    def __post_init__(self) -> None:
        at_least(self, 1, "batch_size")
        super().__post_init__()

    @classmethod
    def converted(cls) -> PretrainConfig:
        """The preset behind ``configs/converted_pretrain.toml``."""
        return cls()

    @classmethod
    def smoke(cls, out_dir: str = "runs/smoke_ar") -> PretrainConfig:
        """A few seconds with the micro model (the test suite's budget)."""
        return cls(
            out_dir=out_dir,
            model=NamedModel.named("tiny", "micro"),
            steps=60,
            batch_size=16,
            warmup_steps=5,
            log_every=5,
            save_every=0,
            final_eval_problems=0,
        )
