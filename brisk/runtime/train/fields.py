"""The fields the training configs share, each declared once with its check.

A training config is a frozen :class:`~brisk.runtime.configs.Config` built from these groups
(``class BaseTrainConfig(Run, Schedule, Placement, IDLMLoss)``): it inherits their fields, so
their names, types, defaults and help live here, the TOML keys and the ``--lr`` / ``--fsdp``
flags stay flat, and each group's ``__post_init__`` checks its own fields before passing on to
the next (:mod:`brisk.runtime.configs`). A config whose default differs (the proposal's
smaller learning rate) gives its own default for the inherited field and nothing else; one
whose default depends on another field (base training's learning rate on ``init``) resolves it
in one property (:attr:`Optimizer.peak_lr`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from brisk.runtime.configs import Config
from brisk.runtime.decode_options import ISDOptions
from brisk.runtime.tasks.spec import TaskSpec

__all__ = [
    "ATTENTIONS",
    "PRECISIONS",
    "DataParallel",
    "IDLMLoss",
    "MaskId",
    "MaskToken",
    "Optimizer",
    "Placement",
    "ProblemSampling",
    "Run",
    "Schedule",
]

ATTENTIONS: tuple[str, ...] = ("dense", "flex", "flex-compiled")
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")


def at_least(config: object, bound: int, *names: str) -> None:
    """Each named field of ``config`` is ≥ ``bound`` (an error naming the first that is not)."""
    for name in names:
        value = getattr(config, name)
        if value < bound:
            raise ValueError(f"{name}: must be ≥ {bound}, got {value!r}")


def positive(config: object, *names: str) -> None:
    """Each named field of ``config`` is > 0."""
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ValueError(f"{name}: must be > 0, got {value!r}")


def counts(config: object, *names: str) -> None:
    """Each named field of ``config`` is an integer ≥ 1 (a bool is not one)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer ≥ 1, got {value!r}")


def one_of(config: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True)
class Run(Config):
    """The run's seed and threads."""

    seed: int = 0
    # One thread: on a shared 2-core machine two OpenMP threads oversubscribe and run slower.
    threads: int = 1

    def __post_init__(self) -> None:
        at_least(self, 1, "threads")
        super().__post_init__()


@dataclass(frozen=True)
class Optimizer(Config):
    """AdamW: β = (0.9, 0.98), no decay on norms and biases, the global gradient norm clipped."""

    lr: float = 3e-3  # the (peak) learning rate
    weight_decay: float = 0.01  # AdamW's decay of the weight matrices
    grad_clip: float = 1.0  # the largest global gradient norm

    @property
    def peak_lr(self) -> float:
        """The learning rate AdamW is built with and the schedule peaks at: ``lr`` (a config
        whose default depends on other fields resolves it here)."""
        return self.lr

    def __post_init__(self) -> None:
        if not self.peak_lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr!r}")
        positive(self, "grad_clip")
        at_least(self, 0, "weight_decay")
        super().__post_init__()


@dataclass(frozen=True)
class Schedule(Optimizer):
    """AdamW with linear warmup, then cosine decay from ``lr`` to ``min_lr``."""

    min_lr: float = 3e-4  # where the cosine decay ends

    @property
    def final_lr(self) -> float:
        """Where the cosine decay ends: ``min_lr`` (resolved here where its default depends on
        other fields, as :attr:`peak_lr`)."""
        return self.min_lr

    def __post_init__(self) -> None:
        super().__post_init__()  # lr itself first: then how min_lr relates to it
        if not 0 < self.final_lr <= self.peak_lr:
            raise ValueError(
                f"min_lr: need 0 < min_lr ≤ lr ({self.peak_lr!r}), got {self.final_lr!r}"
            )

    def cosine(self, t: float) -> float:
        """The learning rate at ``t`` ∈ [0, 1] of the decay (past 1: ``min_lr``)."""
        low, high = self.final_lr, self.peak_lr
        return low + 0.5 * (high - low) * (1 + math.cos(math.pi * min(t, 1.0)))


@dataclass(frozen=True)
class BudgetSchedule(Schedule):
    """A run measured in a token budget instead of steps: linear warmup over ``warmup`` of the
    budget, then cosine decay (proposal and drafter training)."""

    warmup: float = 0.05  # share of the budget spent warming up

    def __post_init__(self) -> None:
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup: must lie in [0, 1), got {self.warmup!r}")
        super().__post_init__()

    def lr_at(self, progress: float) -> float:
        """The learning rate at ``progress`` ∈ [0, 1] of the budget."""
        if progress < self.warmup:
            return self.peak_lr * max(progress / self.warmup, 1e-3)
        return self.cosine((progress - self.warmup) / (1 - self.warmup))


@dataclass(frozen=True)
class DataParallel(Config):
    """Where and how a model trains: one process or torchrun ranks, the precision, the
    micro-batches (every training command; the I-DLM ones add their mask: :class:`Placement`)."""

    fsdp: bool = False  # FSDP2 shards instead of DDP replicas (under torchrun)
    # where one process trains: cpu, cuda, cuda:1 (auto: the GPU where one exists); under
    # torchrun each rank trains on its own GPU (LOCAL_RANK) or the CPU
    device: str = "auto"
    # bf16: bf16 compute, fp32 weights and reductions (auto: bf16 on a GPU, fp32 on the CPU)
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # recompute each decoder layer in the backward (a drafter: its whole forward)
    activation_checkpointing: bool = False
    micro_batch_size: int = 0  # rows per forward on a rank, accumulated (0: its whole share)

    def __post_init__(self) -> None:
        at_least(self, 0, "micro_batch_size")
        one_of(self, "precision", PRECISIONS)
        super().__post_init__()


@dataclass(frozen=True)
class Placement(DataParallel):
    """:class:`DataParallel` and the I-DLM training mask."""

    # the training mask: dense [2L, 2L], or its FlexAttention BlockMask twin (flex-compiled: CUDA)
    attention: Literal["dense", "flex", "flex-compiled"] = "dense"

    def __post_init__(self) -> None:
        one_of(self, "attention", ATTENTIONS)
        super().__post_init__()


@dataclass(frozen=True)
class IDLMLoss(Config):
    """The I-DLM objective's settings: L = CE_noisy + α·CE_clean on blocks laid out from an
    offset."""

    alpha: float | Literal["auto"] = "auto"  # α (auto: CE_noisy / CE_clean, detached)
    # Shift block starts at random each step so every response position acts as an ISD anchor.
    random_block_offset: bool = True

    def __post_init__(self) -> None:
        if self.alpha != "auto" and not (isinstance(self.alpha, int | float) and self.alpha >= 0):
            raise ValueError(f"alpha: expected a number ≥ 0 or 'auto', got {self.alpha!r}")
        super().__post_init__()


@dataclass(frozen=True)
class MaskId(Config):
    """The MASK id of the model a command runs (every command that runs one:
    :func:`brisk.runtime.loader.checkpoint_mask_id` has the order and the checks)."""

    # the MASK id, for a checkpoint that has none (an id it never uses); default: the
    # tokenizer's mask token, else config.json's mask_token_id
    mask_token_id: int | None = None

    def __post_init__(self) -> None:
        value = self.mask_token_id
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"mask_token_id: expected an integer, got {value!r}")
        if value is not None and value < 0:
            raise ValueError(f"mask_token_id: must be ≥ 0, got {value!r}")
        super().__post_init__()


@dataclass(frozen=True)
class MaskToken(MaskId):
    """:class:`MaskId`, or a MASK row added to the checkpoint a run trains from (``init``),
    which the checkpoints it writes carry (base and proposal training)."""

    # give init a MASK token of its own: <|MASK|> added to its tokenizer, one embedding row (and
    # LM-head row when untied) at the mean of the others, saved with every checkpoint
    add_mask_token: bool = False

    def __post_init__(self) -> None:
        if self.add_mask_token and self.mask_token_id is not None:
            raise ValueError(
                "add_mask_token: adds a MASK row of its own; mask_token_id names an existing "
                "id instead (give one of the two)"
            )
        super().__post_init__()


@dataclass(frozen=True)
class ProblemSampling(MaskId):
    """Responses sampled from the deployed decoder (ISD, head off, exact verification) on
    ``problems`` problems of ``task`` (drawn with ``problem_seed``), ``samples`` each: what
    ``brisk train selfgen`` and ``brisk train corrector collect`` decode."""

    task: TaskSpec = field(default_factory=TaskSpec)  # empty: the checkpoint's world, train split
    problems: int = 1000
    samples: int = 4  # responses per problem
    stride: int = 8
    temperature: float = 1.0
    top_k: int = 16
    max_new_tokens: int = 160
    problem_seed: int = 0  # which training problems (the train split: never the held-out ones)
    seed: int = 0  # response r of problem i decodes with seed seed·10⁶ + i·samples + r
    batch_size: int = 128

    def __post_init__(self) -> None:
        counts(self, "problems", "samples", "batch_size")
        self.decode_options()  # the decoder's fields, checked where they are declared
        super().__post_init__()

    def decode_options(self, eos_token_id: int | None = None) -> ISDOptions:
        """The deployed decoder's options (:class:`~brisk.runtime.decode_options.ISDOptions`)."""
        return ISDOptions(
            temperature=self.temperature,
            top_k=self.top_k,
            stride=self.stride,
            max_new_tokens=self.max_new_tokens,
            eos_token_id=eos_token_id,
        )

    def decode_seed(self, problem: int, sample: int) -> int:
        return self.seed * 10**6 + problem * self.samples + sample
