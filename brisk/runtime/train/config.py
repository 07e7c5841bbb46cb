"""Configuration of base-model training: one frozen :class:`~brisk.runtime.configs.Config`.

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

from dataclasses import dataclass, field
from typing import Literal

from brisk.runtime.configs import Config, load_config
from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.tiny.model import TinyModelConfig
from brisk.runtime.tiny.task import TaskConfig

__all__ = ["BaseTrainConfig", "load_config"]


@dataclass(frozen=True)
class BaseTrainConfig(Config):
    """I-DLM training of a base model: by default the preset tiny model on the arithmetic
    world; with ``init`` a user's causal LM (the I-DLM conversion recipe), with ``data`` a
    user's prompts and responses."""

    out_dir: str = "runs/tiny/base"
    init: str = ""  # a causal LM checkpoint to convert (empty: build `model` from scratch)
    add_mask_token: bool = False  # give `init` a MASK token if it has none (embeddings grow)
    # training pairs: empty, the world's base corpus; else a task with prompt and response fields
    data: TaskSpec = field(default_factory=TaskSpec)
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
    # pack examples end to end in rows of this many tokens (0: one example per row; needs flex)
    pack_tokens: int = 0
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
        # Types are checked where configs are parsed (from_dict); these are the value ranges.
        for name in ("steps", "batch_size", "log_every", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be ≥ 1, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "eval_every", "eval_problems", "final_eval_problems",
                     "save_every", "weight_decay", "micro_batch_size",
                     "pack_tokens"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)!r}")
        for name in ("lr", "grad_clip", "max_minutes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"min_lr: need 0 < min_lr ≤ lr ({self.lr!r}), got {self.min_lr!r}")
        if not self.strides or any(n < 2 for n in self.strides):
            raise ValueError(f"strides: need strides N ≥ 2, got {self.strides}")
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ValueError(f"alpha: expected a number ≥ 0 or 'auto', got {self.alpha!r}")
        if self.attention not in ("dense", "flex", "flex-compiled"):
            raise ValueError(
                f"attention: expected one of dense, flex, flex-compiled, got {self.attention!r}"
            )
        if self.pack_tokens and self.attention == "dense":
            raise ValueError("pack_tokens: packed rows need attention = flex or flex-compiled "
                             "(the dense mask has no document ids)")  # fmt: skip
        if self.pack_tokens and self.pack_tokens > self.model.max_positions and not self.init:
            raise ValueError(
                f"pack_tokens: {self.pack_tokens} is longer than the model's "
                f"{self.model.max_positions} positions (model.max_positions)"
            )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision: expected auto, fp32 or bf16, got {self.precision!r}")
        if self.add_mask_token and not self.init:
            raise ValueError("add_mask_token: only a checkpoint given as init gets one added")
        if self.data.name:
            raise ValueError("data: a data file (path) with prompt and response fields")

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
            task=TaskConfig.paper(),
            model=TinyModelConfig(max_positions=256),
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
