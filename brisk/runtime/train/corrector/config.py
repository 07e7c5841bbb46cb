"""Configuration of corrector training (``brisk train corrector``) and of the event collection
before it (``brisk train corrector collect``): frozen configs.

Loaded from TOML/JSON like the other training configs (unknown keys are errors naming the key);
the command line overrides single fields. Defaults are the paper's
(tab:head_implementation_details): AdamW at 3e-4, β = 0.01, Top-16, FP32 head, supervision
through the first rejection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brisk.runtime.train.fields import (
    MaskId,
    Optimizer,
    ProblemSampling,
    Run,
    at_least,
    counts,
    one_of,
)

__all__ = ["FEATURE_DTYPES", "HEAD_SIZES", "TARGETS", "CollectOptions", "CorrectorTrainConfig"]

FEATURE_DTYPES = ("float32", "float16")

Target = Literal["verifier", "top1"]
HeadSize = Literal["paper", "small"]
TARGETS: tuple[str, ...] = ("verifier", "top1")
HEAD_SIZES: tuple[str, ...] = ("paper", "small")


@dataclass(frozen=True)
class CorrectorTrainConfig(Run, Optimizer, MaskId):
    """Verifier-distilled corrector training on a store of policy-reached events (the frozen
    backbone's MASK id: ``mask_token_id``, else the one the store was collected with)."""

    events: str = ""  # event store (``brisk train corrector collect``)
    out_dir: str = "runs/corrector"
    K: int = 16  # candidates per position (≤ the store's K: the leading K are used)
    # verifier: CE against p restricted to and renormalized over C_i (the paper's);
    # top1: hard CE against the verifier's top-1 within C_i (an ablation)
    target: Target = "verifier"
    beta: float = 0.01  # weight of the anchor KL(q_S ‖ r)
    feedback: bool = True  # previous-token feedback (False: a position-wise reranker)
    only_correct: bool = True  # events of responses graded correct only (the paper's data)
    head: HeadSize = "paper"  # the paper's widths (state 128, projections 64/64/16/16, rank 64)
    epochs: int = 4
    batch_size: int = 256  # events per step
    lr: float = 3e-4
    val_fraction: float = 0.1  # share of requests held out for the validation loss
    log_every: int = 10
    eval_every: int = 0  # steps between validation passes (0: once per epoch)
    save_every: int = 0  # steps between checkpoints (0: only the final one)
    # where the frozen backbone and the head run, and the backbone's dtype (auto: the GPU in
    # bfloat16 where one exists, else the CPU in float32; the head trains in float32)
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        counts(self, "K", "epochs", "batch_size", "log_every")
        at_least(self, 0, "eval_every", "save_every")
        if not self.beta >= 0:
            raise ValueError(f"beta: must be ≥ 0, got {self.beta!r}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction: must lie in (0, 1), got {self.val_fraction!r}")
        one_of(self, "target", TARGETS)
        one_of(self, "head", HEAD_SIZES)
        super().__post_init__()


@dataclass(frozen=True)
class CollectOptions(ProblemSampling):
    """Which training problems to decode, and how (the deployed decoder, head off)."""

    samples: int = 2
    top_k: int = 32  # candidates kept per position: serves heads with K ≤ top_k
    feature_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype: one of {FEATURE_DTYPES}, got {self.feature_dtype!r}")
        super().__post_init__()
