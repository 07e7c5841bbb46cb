"""Configuration of base-model training: one frozen :class:`~brisk.runtime.configs.Config`.

A config file mirrors the dataclass; ``[task]`` and ``[model]`` name a registered task and model
preset with their settings (:class:`~brisk.runtime.tasks.task.NamedTask`,
:class:`~brisk.runtime.presets.NamedModel`)::

    steps = 2000
    strides = [2, 4, 8]
    [task]
    name = "arithmetic"
    max_operands = 3
    [model]
    name = "tiny"
    hidden_size = 128

A table without ``name`` is the arithmetic world's and the tiny preset's (configs written before
names were). Unknown keys are an error naming the key, so a typo never silently trains the
default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from brisk.runtime.configs import load_config
from brisk.runtime.presets import NamedModel
from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.tasks.task import NamedTask
from brisk.runtime.train.fields import (
    IDLMLoss,
    MaskToken,
    Placement,
    Run,
    Schedule,
    at_least,
    positive,
)

__all__ = ["INIT_LR", "SCRATCH_LR", "BaseTrainConfig", "StepRun", "load_config"]

SCRATCH_LR = (3e-3, 3e-4)
"""Base training's peak and final learning rates from scratch (a model preset, randomly
initialized)."""

INIT_LR = (1e-4, 1e-5)
"""Base training's peak and final learning rates from ``init``: a pretrained model fine-tuned,
which 3e-3 wrecks in a few steps (SmolLM2-135M's clean CE 1.21 → 14.7 in two), keeps its loss
at 1e-4 (the top of what full fine-tuning and the I-DLM and SDAR conversions of pretrained LMs
use, 1e-5 to 1e-4), while its new MASK stream learns."""


@dataclass(frozen=True)
class StepRun(Run, Schedule):
    """A run of ``steps`` optimizer steps (base and AR pre-training): warmup, logging,
    checkpoints, the held-out evaluation after training and the wall-clock budget."""

    steps: int = 2000
    warmup_steps: int = 50  # steps of linear warmup before the cosine decay
    log_every: int = 25
    save_every: int = 500  # steps between resumable checkpoints (0: only the final one)
    final_eval_problems: int = 200  # held-out problems decoded after training (0: none)
    eval_seed: int = 1  # which held-out problems (the test split's seed)
    max_minutes: float = 14.0  # wall-clock budget; training stops early and saves when exceeded

    def __post_init__(self) -> None:
        at_least(self, 1, "steps", "log_every")
        at_least(self, 0, "warmup_steps", "save_every", "final_eval_problems")
        positive(self, "max_minutes")
        super().__post_init__()

    def lr_at_step(self, step: int) -> float:
        """Linear warmup over ``warmup_steps``, then cosine decay from ``lr`` to ``min_lr``."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        return self.cosine((step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1))


@dataclass(frozen=True)
class BaseTrainConfig(StepRun, Placement, IDLMLoss, MaskToken):
    """I-DLM training of a base model: by default the preset tiny model on the arithmetic
    world; with ``init`` a user's causal LM (the I-DLM conversion recipe), with ``data`` a
    user's prompts and responses. The learning rate's default depends on ``init``
    (:attr:`peak_lr`)."""

    out_dir: str = "runs/tiny/base"
    init: str = ""  # a causal LM checkpoint to convert (empty: build `model` from scratch)
    # the peak learning rate (default: 3e-3 from scratch; 1e-4 from init, which keeps a
    # pretrained model's loss where 3e-3 wrecks it)
    lr: float | None = None
    # where the cosine decay ends (default: 3e-4 from scratch, 1e-5 from init; at most lr)
    min_lr: float | None = None
    # training pairs: empty, the world's base corpus; else a task with prompt and response fields
    data: TaskSpec = field(default_factory=TaskSpec)
    # the world: its train split is the base corpus (without data), its test split held out
    task: NamedTask = field(default_factory=lambda: NamedTask.named("arithmetic", "tiny"))
    model: NamedModel = field(default_factory=lambda: NamedModel.named("tiny"))
    batch_size: int = 32
    # Stride curriculum (I-DLM: 2 → 3 → 4): equal shares of the steps, in this order.
    strides: tuple[int, ...] = (2, 4, 8)
    # pack examples end to end in rows of this many tokens (0: one example per row; needs flex)
    pack_tokens: int = 0
    eval_every: int = 0
    eval_problems: int = 100

    def __post_init__(self) -> None:
        # Types are checked where configs are parsed (from_dict); these are the value ranges.
        at_least(self, 1, "batch_size")
        at_least(self, 0, "eval_every", "eval_problems", "pack_tokens")
        if not self.strides or any(n < 2 for n in self.strides):
            raise ValueError(f"strides: need strides N ≥ 2, got {self.strides}")
        if self.pack_tokens and self.attention == "dense":
            raise ValueError(
                "pack_tokens: packed rows need attention = flex or flex-compiled (the dense mask "
                "has no document ids)"
            )
        if self.pack_tokens and self.pack_tokens > self.model.max_positions and not self.init:
            raise ValueError(
                f"pack_tokens: {self.pack_tokens} is longer than the model's "
                f"{self.model.max_positions} positions (model.max_positions)"
            )
        if self.add_mask_token and not self.init:
            raise ValueError("add_mask_token: only a checkpoint given as init gets one added")
        if self.data.name:
            raise ValueError("data: a data file (path) with prompt and response fields")
        super().__post_init__()

    @property
    def peak_lr(self) -> float:
        """``lr``, by default :data:`SCRATCH_LR`'s from scratch and :data:`INIT_LR`'s from
        ``init``."""
        if self.lr is not None:
            return self.lr
        return (INIT_LR if self.init else SCRATCH_LR)[0]

    @property
    def final_lr(self) -> float:
        """``min_lr``, by default :data:`SCRATCH_LR`'s or :data:`INIT_LR`'s (at most
        :attr:`peak_lr`)."""
        if self.min_lr is not None:
            return self.min_lr
        return min((INIT_LR if self.init else SCRATCH_LR)[1], self.peak_lr)

    @classmethod
    def tiny(cls) -> BaseTrainConfig:
        """The preset behind ``configs/tiny_base.toml``."""
        return cls()

    @classmethod
    def paper(cls) -> BaseTrainConfig:
        """The preset behind ``configs/paper_base.toml``: the paper-regime world (≤ 20 min on
        the 2-core CPU, both threads)."""
        return cls(
            out_dir="runs/paper/base",
            task=NamedTask.named("arithmetic", "paper"),
            model=NamedModel.named("tiny", max_positions=256),
            steps=1650,
            eval_problems=200,
            threads=2,
            max_minutes=19.5,
        )

    @classmethod
    def smoke(cls, out_dir: str = "runs/smoke") -> BaseTrainConfig:
        """A few seconds on the trivial task with the micro model (the test suite's budget)."""
        return cls(
            out_dir=out_dir,
            task=NamedTask.named("arithmetic", "trivial"),
            model=NamedModel.named("tiny", "micro"),
            steps=200,
            batch_size=32,
            warmup_steps=10,
            strides=(2, 4),
            log_every=10,
            eval_every=0,
            eval_problems=0,
            final_eval_problems=0,
            save_every=0,
        )

    def resolved(self) -> BaseTrainConfig:
        """This config with the learning rates its defaults resolve to (:attr:`peak_lr`,
        :attr:`final_lr`) written out: what a run saves and compares on resume."""
        return dataclasses.replace(self, lr=self.peak_lr, min_lr=self.final_lr)

    def stride_at(self, step: int) -> int:
        """The curriculum's stride N at ``step`` (0-based)."""
        phase = min(step * len(self.strides) // self.steps, len(self.strides) - 1)
        return self.strides[phase]
