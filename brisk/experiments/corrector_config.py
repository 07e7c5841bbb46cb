"""The corrector ablation's configuration (``brisk experiment corrector --config FILE``): its
arms (:data:`ARMS`) and the experiment's config, which holds the corrector commands' own
configs (:mod:`brisk.experiments.corrector` runs it)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from brisk.experiments.common import EvalSection, ExperimentPlan, HeldOut
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig

__all__ = [
    "ARMS",
    "PAPER_ARM",
    "CorrectorArm",
    "CorrectorExperimentConfig",
    "HeadEvalSection",
    "arm_named",
]


@dataclass(frozen=True)
class CorrectorArm:
    name: str
    label: str  # the table's "Head" column
    train: dict[str, Any]  # CorrectorTrainConfig fields that differ from the paper's head
    trained: bool = True


ARMS: tuple[CorrectorArm, ...] = (
    CorrectorArm("off", "No corrector (head off)", {}, trained=False),
    CorrectorArm("distilled", "**BRISK: verifier-distilled, K = 16**", {}),
    CorrectorArm("top1", "Verifier top-1 only (hard CE)", {"target": "top1"}),
    CorrectorArm("no-kl", "Without KL anchor (β = 0)", {"beta": 0.0}),
    CorrectorArm("no-prefix", "Without prefix feedback", {"feedback": False}),
    CorrectorArm("k4", "Verifier-distilled, K = 4", {"K": 4}),
    CorrectorArm("k8", "Verifier-distilled, K = 8", {"K": 8}),
    CorrectorArm("k32", "Verifier-distilled, K = 32", {"K": 32}),
)
PAPER_ARM = "distilled"


@dataclass(frozen=True)
class HeadEvalSection(EvalSection):
    shadow: bool = True  # the same-state diagnostics of every trained arm × seed


@dataclass(frozen=True)
class CorrectorExperimentConfig(ExperimentPlan):
    out_dir: str = "runs/paper/corrector"
    backbone: str = "runs/paper/base/final"
    arms: tuple[str, ...] = tuple(a.name for a in ARMS)
    # the commands' own configs: [collect] is brisk train corrector collect's (its stride is the
    # experiment's), [train] brisk train corrector's (events, out_dir and seed set per job,
    # then each arm's changes)
    collect: CollectOptions = field(default_factory=lambda: CollectOptions(problems=2000))
    train: CorrectorTrainConfig = field(default_factory=CorrectorTrainConfig)
    eval: HeadEvalSection = field(default_factory=HeadEvalSection)

    def known_arms(self) -> Collection[str]:
        return {a.name for a in ARMS}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.arms:
            K = arm_named(name).train.get("K", 16)
            if self.collect.top_k < K:
                raise ValueError(
                    f"collect.top_k: {self.collect.top_k} < K = {K} of arm {name!r} (the events "
                    "must hold every arm's candidates)"
                )

    @property
    def held_out(self) -> HeldOut:
        """Every arm's evaluation: ``[eval]``'s problems of the backbone's world."""
        return HeldOut(
            self.backbone, self.eval, self.stride, self.device, self.dtype, self.mask_token_id
        )


def arm_named(name: str) -> CorrectorArm:
    return next(a for a in ARMS if a.name == name)
