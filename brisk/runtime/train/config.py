"""Configuration of base-model training: one frozen dataclass, loadable from TOML or JSON.

A config file mirrors the dataclass; ``[task]`` and ``[model]`` sections fill the nested configs::

    steps = 2000
    strides = [2, 4, 8]
    [task]
    max_operands = 3
    [model]
    hidden_size = 128

Unknown keys are an error naming the key, so a typo never silently trains the default.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from brisk.runtime.tiny.model import TinyModelConfig
from brisk.runtime.tiny.task import TaskConfig

__all__ = ["BaseTrainConfig"]


@dataclass(frozen=True)
class BaseTrainConfig:
    """Training of the tiny base model with the I-DLM objective on the arithmetic task."""

    out_dir: str = "runs/tiny_base"
    seed: int = 0
    task: TaskConfig = field(default_factory=TaskConfig.tiny)
    model: TinyModelConfig = field(default_factory=TinyModelConfig.tiny)
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    alpha: float | Literal["auto"] = "auto"
    # Stride curriculum (I-DLM: 2 → 3 → 4): equal shares of the steps, in this order.
    strides: tuple[int, ...] = (2, 4, 8)
    # Shift block starts at random each step so every response position acts as an ISD anchor.
    random_block_offset: bool = True
    log_every: int = 25
    eval_every: int = 0
    eval_problems: int = 100
    final_eval_problems: int = 200
    eval_seed: int = 1
    save_every: int = 500
    # One thread: on a shared 2-core machine two OpenMP threads oversubscribe and run slower.
    threads: int = 1
    max_minutes: float = 14.0  # wall-clock budget; training stops early and saves when exceeded

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps/batch_size: must be ≥ 1")
        if not self.strides or any(n < 2 for n in self.strides):
            raise ValueError(f"strides: need strides N ≥ 2, got {self.strides}")
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ValueError(f"alpha: expected a number ≥ 0 or 'auto', got {self.alpha!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError("min_lr: need 0 < min_lr ≤ lr")

    @classmethod
    def tiny(cls) -> BaseTrainConfig:
        """The preset behind ``configs/tiny_base.toml``."""
        return cls()

    @classmethod
    def smoke(cls, out_dir: str = "runs/smoke") -> BaseTrainConfig:
        """A few seconds on the trivial task with the micro model (the test suite's budget)."""
        return cls(
            out_dir=out_dir,
            task=TaskConfig.trivial(),
            model=TinyModelConfig.micro(),
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

    def stride_at(self, step: int) -> int:
        """The curriculum's stride N at ``step`` (0-based)."""
        phase = min(step * len(self.strides) // self.steps, len(self.strides) - 1)
        return self.strides[phase]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BaseTrainConfig:
        data = dict(data)
        _check_keys(cls, data, "")
        if "task" in data:
            _check_keys(TaskConfig, data["task"], "task.")
            data["task"] = TaskConfig(**data["task"])
        if "model" in data:
            _check_keys(TinyModelConfig, data["model"], "model.")
            data["model"] = TinyModelConfig(**data["model"])
        if "strides" in data:
            data["strides"] = tuple(data["strides"])
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> BaseTrainConfig:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as err:
            raise ValueError(f"--config: cannot read {path}: {err.strerror}") from None
        if path.suffix == ".toml":
            return cls.from_dict(tomllib.loads(text))
        if path.suffix == ".json":
            return cls.from_dict(json.loads(text))
        raise ValueError(f"--config: expected a .toml or .json file, got {path}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> BaseTrainConfig:
        return dataclasses.replace(self, **changes)


def _check_keys(cls: type, data: object, prefix: str) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{prefix.rstrip('.')}: expected a table of settings")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            raise ValueError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(known))})")
