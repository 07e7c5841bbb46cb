"""The proposal-training ablation's configuration (``brisk experiment proposal --config FILE``):
its arms (:data:`ARMS`), the ``[head]`` section of the head-on row and the experiment's config,
which holds the training commands' own configs (:mod:`brisk.experiments.proposal` runs
it).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from brisk.experiments.common import EvalSection, ExperimentPlan, HeldOut
from brisk.runtime.configs import Config
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig
from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.selfgen import SelfGenOptions

__all__ = [
    "ARMS",
    "BRISK_ARM",
    "Arm",
    "ExperimentConfig",
    "HeadSection",
    "arm_named",
    "budget_label",
    "split_job",
]


@dataclass(frozen=True)
class Arm:
    name: str
    data: str  # "base" for the untrained base
    weights: str
    profile: str
    labels: tuple[str, str]  # (training data, W.) columns of the table


# fmt: off
ARMS: tuple[Arm, ...] = (
    Arm("base", "base", "-", "-", ("Base (no continued training)", "–")),
    Arm("reference-dynamic", "reference", "brisk", "dynamic", ("Open-source (reference)", "D")),
    Arm("selfgen-all-dynamic", "selfgen-all", "brisk", "dynamic", ("Self-gen. (all)", "D")),
    Arm("selfgen-correct-uniform", "selfgen-correct", "uniform", "dynamic",
        ("Self-gen. (corr.)", "U")),
    Arm("selfgen-correct-dynamic", "selfgen-correct", "brisk", "dynamic",
        ("Self-gen. (corr.)", "D")),
    Arm("selfgen-correct-static", "selfgen-correct", "brisk", "static",
        ("Self-gen. (corr.)", "S")),
    Arm("selfgen-correct-dpace", "selfgen-correct", "dpace", "dynamic",
        ("Self-gen. (corr.)", "D-PACE")),
    Arm("selfgen-correct-decay", "selfgen-correct", "decay", "dynamic",
        ("Self-gen. (corr.)", "decay")),
)
# fmt: on
BRISK_ARM = "selfgen-correct-dynamic"


@dataclass(frozen=True)
class HeadSection(Config):
    """``[head]``: the head-on row (module docstring), with the corrector experiment's own
    configs: ``[head.collect]`` is ``brisk train corrector collect``'s (its stride is the
    experiment's), ``[head.train]`` ``brisk train corrector``'s (events, out_dir and seed are
    set per job). A config without ``[head]`` has no head-on row."""

    enabled: bool = True  # a [head] section asks for the row; false: none, as without [head]
    collect: CollectOptions = field(default_factory=lambda: CollectOptions(problems=2000))
    train: CorrectorTrainConfig = field(default_factory=CorrectorTrainConfig)

    def __post_init__(self) -> None:
        if self.collect.top_k < self.train.K:
            raise ValueError(
                f"collect.top_k: {self.collect.top_k} < train.K = {self.train.K} (the events "
                "must hold the head's candidates)"
            )


@dataclass(frozen=True)
class ExperimentConfig(ExperimentPlan):
    out_dir: str = "runs/paper/ablation"
    base: str = "runs/paper/base/final"
    arms: tuple[str, ...] = tuple(a.name for a in ARMS)
    # token budgets in epochs of the base's correct self-generated responses, the same for every
    # arm (token-matched; each budget a row per arm); empty: [train] token_budget
    budgets: tuple[float, ...] = ()
    theory_samples: int = 200  # common samples of the theory tables (0: no theory tables)
    # the training configs themselves, each arm and seed changing what it must with replace:
    # [selfgen] is brisk train selfgen's (its stride is the experiment's), [train] brisk train
    # proposal's (init, dataset, out_dir, data, weights, profile, seed, stride and temperature
    # are set per job)
    selfgen: SelfGenOptions = field(default_factory=SelfGenOptions)
    train: ProposalTrainConfig = field(default_factory=ProposalTrainConfig)
    eval: EvalSection = field(default_factory=EvalSection)
    # the head-on row: off unless the file has a [head] section (HeadSection)
    head: HeadSection = field(default_factory=lambda: HeadSection(enabled=False))

    def known_arms(self) -> Collection[str]:
        return {a.name for a in ARMS}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head.enabled and all(a == "base" for a in self.arms):
            raise ValueError("head: the head-on row needs a trained arm (arms has only 'base')")
        if any(not b > 0 for b in self.budgets) or len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets: need distinct epochs > 0, got {self.budgets!r}")
        if self.theory_samples < 0:
            raise ValueError(f"theory_samples: must be ≥ 0, got {self.theory_samples!r}")

    @property
    def held_out(self) -> HeldOut:
        """Every row's evaluation: ``[eval]``'s problems of the base's world."""
        return HeldOut(
            self.base, self.eval, self.stride, self.device, self.dtype, self.mask_token_id
        )

    def job_names(self) -> list[str]:
        """The table's rows: each arm, or each arm at each budget (``arm@5ep``); the base arm
        is trained for no budget."""
        if not self.budgets:
            return list(self.arms)
        return [
            a if a == "base" else f"{a}@{b:g}ep"
            for a in self.arms
            for b in (self.budgets if a != "base" else (0,))
        ]


def split_job(name: str) -> tuple[str, float | None]:
    """``arm@5ep`` → (arm, 5.0); a plain arm → (arm, None)."""
    arm, _, budget = name.partition("@")
    return arm, float(budget.removesuffix("ep")) if budget else None


def budget_label(name: str) -> str:
    """The table's budget cell of a job (``5 ep``; ``–`` for a plain arm)."""
    epochs = split_job(name)[1]
    return "–" if epochs is None else f"{epochs:g} ep"


def arm_named(name: str) -> Arm:
    return next(a for a in ARMS if a.name == name)
