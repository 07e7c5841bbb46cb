"""Configuration of corrector training (``brisk train corrector``): one frozen dataclass.

Loaded from TOML/JSON like the other training configs (unknown keys are errors naming the key);
the command line overrides single fields. Defaults are the paper's
(tab:head_implementation_details): AdamW at 3e-4, β = 0.01, Top-16, FP32 head, supervision
through the first rejection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brisk.runtime.configs import Config

__all__ = ["HEAD_SIZES", "TARGETS", "CorrectorTrainConfig"]

Target = Literal["verifier", "top1"]
HeadSize = Literal["paper", "small"]
TARGETS: tuple[str, ...] = ("verifier", "top1")
HEAD_SIZES: tuple[str, ...] = ("paper", "small")


@dataclass(frozen=True)
class CorrectorTrainConfig(Config):
    """Verifier-distilled corrector training on a store of policy-reached events."""

    events: str = ""  # event store (``brisk train corrector collect``)
    out_dir: str = "runs/corrector"
    seed: int = 0
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
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    val_fraction: float = 0.1  # share of requests held out for the validation loss
    log_every: int = 10
    eval_every: int = 0  # steps between validation passes (0: once per epoch)
    save_every: int = 0  # steps between checkpoints (0: only the final one)
    threads: int = 1

    def __post_init__(self) -> None:
        for name in ("K", "epochs", "batch_size", "log_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer ≥ 1, got {value!r}")
        for name in ("eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be ≥ 0, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be > 0, got {self.lr!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta: must be ≥ 0, got {self.beta!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip: must be > 0, got {self.grad_clip!r}")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction: must lie in (0, 1), got {self.val_fraction!r}")
        for name, allowed in (("target", TARGETS), ("head", HEAD_SIZES)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}: expected one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
