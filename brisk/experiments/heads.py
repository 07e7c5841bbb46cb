"""The corrector head's steps in an experiment, each skipped when its output exists: collect a
backbone's events once, train a head on them (the corrector ablation's arms and the proposal
ablation's head-on row both run them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig

__all__ = ["collect_once", "train_head"]


def collect_once(
    backbone: str | Path,
    events: str | Path,
    options: CollectOptions,
    show_progress: bool = False,
    *,
    device: str | None = None,
    dtype: str | None = None,
) -> Any:
    """The event store of ``backbone`` at ``events`` (``brisk train corrector collect``), unless
    it is complete already (then None); a collection cut short continues from its last whole
    batch. Returns the :class:`~brisk.runtime.train.corrector.events.EventStore` it wrote."""
    from brisk.runtime.train.corrector.events import collect_from_checkpoint

    if (Path(events) / "_events.json").exists():
        return None
    return collect_from_checkpoint(
        backbone, events, options, show_progress=show_progress, device=device, dtype=dtype
    )


def train_head(tcfg: CorrectorTrainConfig) -> tuple[Any, dict[str, Any]]:
    """Train the head of ``tcfg`` into ``tcfg.out_dir`` unless its ``final/`` exists (a run cut
    short continues from its newest checkpoint); returns the loaded
    :class:`~brisk.runtime.corrector.Corrector` and what the training reported
    (``train.json``, kept for a rerun that finds the head trained: ``{}`` if it was lost)."""
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.train.corrector.recipe import train_corrector

    run = Path(tcfg.out_dir)
    trained = run / "train.json"
    if not (run / "final" / "config.json").exists():
        r = train_corrector(tcfg, show_progress=False)
        atomic_write_text(
            trained,
            json.dumps(
                {
                    "val_loss": r.outcome.val_loss,
                    "val_loss_init": r.outcome.val_loss_init,
                    "steps": r.steps,
                    "train_events": r.outcome.train_events,
                    "train_s": r.wall_s,
                }
            ),
        )
    info = dict(json.loads(trained.read_text())) if trained.exists() else {}
    return Corrector.from_pretrained(run / "final"), info
