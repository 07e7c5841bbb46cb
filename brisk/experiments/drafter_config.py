"""The drafter experiment's configuration (``brisk experiment drafter --config FILE``): the
``[eval]`` section (the held-out prompts every job decodes), the ``[head]`` section (which arms'
drafters also get a corrector) and the experiment's config, which holds ``brisk train
drafter``'s own config (:mod:`brisk.experiments.drafter` runs it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from brisk.runtime.configs import Config
from brisk.runtime.train.drafter.config import WEIGHTINGS, DrafterTrainConfig
from brisk.runtime.train.fields import MaskId, counts, one_of, positive

__all__ = ["DrafterEval", "DrafterExperimentConfig", "DrafterHead"]


@dataclass(frozen=True)
class DrafterEval(Config):
    """``[eval]``: the held-out prompts every job decodes, and how."""

    problems: int = 68
    max_new_tokens: int = 128
    temperature: float = 0.0  # the target's; drafts greedy (0) or from the drafter's Top-K
    top_k: int = 16

    def __post_init__(self) -> None:
        if self.problems < 1 or self.max_new_tokens < 1 or self.top_k < 1:
            raise ValueError("eval: problems, max_new_tokens and top_k must be ≥ 1")
        if not self.temperature >= 0:
            raise ValueError(f"eval.temperature: must be ≥ 0, got {self.temperature!r}")
        super().__post_init__()


@dataclass(frozen=True)
class DrafterHead(Config):
    """``[head]``: which arms' drafters also get a corrector (none by default), its events and
    its training."""

    arms: tuple[str, ...] = ()
    problems: int = 256  # training prompts of the dataset's task decoded for the head's events
    size: str = "small"  # the head's widths: small, or the paper's
    K: int = 16  # candidates per position (≤ eval.top_k, the events' Top-K)
    epochs: int = 4
    batch_size: int = 64
    lr: float = 1e-3

    def __post_init__(self) -> None:
        try:
            counts(self, "problems", "K", "epochs", "batch_size")
            one_of(self, "size", ("small", "paper"))
            positive(self, "lr")
        except ValueError as err:
            raise ValueError(f"head.{err}") from None
        super().__post_init__()


@dataclass(frozen=True)
class DrafterExperimentConfig(MaskId):
    """Where it writes, the target and its regenerated data, the arms (weightings), the seeds,
    the jobs run at once, the training every job shares and the evaluation; the target's MASK
    id where it has none (``mask_token_id``, or ``[train]``'s)."""

    out_dir: str = "runs/drafter_experiment"
    target: str = ""
    dataset: str = ""
    arms: tuple[str, ...] = WEIGHTINGS
    seeds: tuple[int, ...] = (0, 1, 2)
    workers: int = 2
    train: DrafterTrainConfig = field(default_factory=DrafterTrainConfig)
    eval: DrafterEval = field(default_factory=DrafterEval)
    head: DrafterHead = field(default_factory=DrafterHead)

    def __post_init__(self) -> None:
        for name in self.arms:
            if name not in WEIGHTINGS:
                raise ValueError(f"arms: unknown arm {name!r} (known: {', '.join(WEIGHTINGS)})")
        for name in self.head.arms:
            if name not in self.arms:
                raise ValueError(f"head.arms: {name!r} is not one of the experiment's arms")
        if self.head.arms and self.eval.top_k < self.head.K:
            raise ValueError(
                f"head.K: {self.head.K} candidates, but the events keep eval.top_k = "
                f"{self.eval.top_k}"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: need distinct seeds, got {self.seeds!r}")
        if self.workers < 1:
            raise ValueError(f"workers: must be ≥ 1, got {self.workers!r}")
        for name in ("target", "dataset"):
            if not getattr(self, name):
                raise ValueError(f"{name}: the experiment needs one")
        super().__post_init__()
