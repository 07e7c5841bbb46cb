"""What the training loops share beyond resuming (:mod:`brisk.runtime.train.resume`): the
result of a run of steps, AdamW as every loop builds it, and a run's CPU settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from brisk.runtime.train.evaluate import EvalReport

__all__ = ["TrainResult", "adamw", "cpu_settings"]


@dataclass(frozen=True)
class TrainResult:
    """What ``brisk train base`` and ``brisk train ar`` return."""

    checkpoint: Path  # the final save_pretrained directory
    history: list[dict[str, Any]]  # every record written to metrics.jsonl
    report: EvalReport | None  # held-out evaluation after training (None if disabled)
    wall_s: float  # training wall time, evaluation and final save excluded


def adamw(model: Any, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.98) without decay on norms and biases (1-D tensors), the usual GPT
    recipe; for an FSDP model build it after sharding (its parameters are then DTensors)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98))


@contextmanager
def cpu_settings(threads: int) -> Iterator[None]:
    """Thread count and denormal flushing for the run, restored afterwards (tests share a
    process)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # denormal weights/activations can slow CPU matmuls many-fold
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)
