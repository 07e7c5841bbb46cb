"""What the training loops share to stop and resume exactly (``--resume``), and to write a
checkpoint atomically.

A checkpoint ``checkpoint-NNNNNN/`` holds the weights and, in ``trainer_state.pt``, everything
else the next step depends on: optimizer, step, data position, every RNG state, the size of
``metrics.jsonl`` when it was written. A resumed run continues from the newest complete one and
ends bit-identical on CPU to a run that was never stopped. The rules of a run directory are the
same for every training command (:func:`start_checkpoint`): a directory that holds a run is
never trained into again from scratch, a finished run is never trained again, and a run is only
continued with the configuration it was started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from brisk._atomic import building_dir
from brisk._interrupt import Interrupted
from brisk.runtime.configs import Config

__all__ = [
    "METRICS",
    "STATE",
    "MetricsLog",
    "config_changes",
    "interrupted_at",
    "latest_checkpoint",
    "load_state",
    "restore_rng",
    "rng_state",
    "save_checkpoint",
    "start_checkpoint",
    "write_checkpoint",
]

STATE = "trainer_state.pt"
METRICS = "metrics.jsonl"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-NNNNNN`` of a run (None if there is none)."""
    done = [p for p in Path(out_dir).glob("checkpoint-*") if (p / STATE).is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def config_changes(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """``"key: saved ≠ current"`` for every setting that differs, nested keys dotted
    (``model.layers``)."""
    changes = []
    for key in sorted(set(saved) | set(current), key=str):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key}: {a!r} ≠ {b!r}")
    return changes


def start_checkpoint(
    out: Path, resume: bool, config: Config, config_file: str = "train_config.json"
) -> Path | None:
    """Where a training run into ``out`` starts (None: from scratch), by the rules every training
    command shares; a refusal is a ``ValueError`` naming the directory and the way out.

    - a finished run (``final/``) is never trained again;
    - without ``resume``, a directory that holds a run (``metrics.jsonl``, a checkpoint) is
      refused: nothing is overwritten silently;
    - with ``resume``, the newest complete checkpoint, whose saved ``config_file`` must equal
      ``config`` (read as ``config``'s class reads it: a file of an older brisk in its own
      words) but for ``out_dir`` and where it runs (``device``, ``dtype``: a run may
      move to another machine; the differences are named); with none (an empty or new
      directory, or a run killed before its first checkpoint) the run starts from scratch, so a
      script may always pass ``--resume``; checkpoints without a trainer state (written by an
      older brisk) cannot be continued exactly and are refused.
    """
    if (out / "final").exists():
        way_out = "nothing to resume" if resume else "choose another --out"
        flag = "--resume" if resume else "--out"
        raise ValueError(f"{flag}: {out} holds a finished run ({out / 'final'}); {way_out}")
    if not resume:
        used = sorted(p.name for p in out.glob("checkpoint-*"))[-1:]
        used += [METRICS] if (out / METRICS).exists() else []
        if used:
            raise ValueError(
                f"--out: {out} already holds a run ({', '.join(used)}); pass --resume to "
                "continue it or choose another --out"
            )
        return None
    start = latest_checkpoint(out)
    if start is None and list(out.glob("checkpoint-*")):
        old = max(p.name for p in out.glob("checkpoint-*"))
        raise ValueError(
            f"--resume: {out / old} has no {STATE} (written before checkpoints held the trainer "
            "state): it cannot be continued exactly; choose another --out"
        )
    if start is not None:
        saved = json.loads((start / config_file).read_text())
        # In today's words (e.g. a [task] table saved before tables were named); settings this
        # brisk no longer reads are compared as they are, and named.
        with contextlib.suppress(ValueError):
            saved = type(config).from_dict(saved).to_dict()
        saved = json.loads(json.dumps(saved))
        current = json.loads(json.dumps(config.to_dict()))  # as it reads back: tuples are lists
        free = dict.fromkeys(("out_dir", "device", "dtype"))
        changes = config_changes({**saved, **free}, {**current, **free})
        if changes:
            raise ValueError(
                f"--resume: {start} was trained with another configuration ({'; '.join(changes)})"
            )
    return start


def save_checkpoint(
    model: Any,
    tokenizer: Any,
    cfg: Config,
    path: Path,
    state: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    keep: bool = False,
) -> Path:
    """Write model, tokenizer, config (``train_config.json``) and (for a checkpoint to resume
    from) the trainer ``state`` to ``path`` atomically (temp dir, then rename). ``weights``: the
    state dict to save instead of the model's own (an FSDP model's gathered weights); ``keep``:
    the temporary directory holds files already (its FSDP shards) and is written into, not
    emptied. A write that fails (a full disk) leaves the previous checkpoint at ``path`` and no
    temporary directory."""
    with building_dir(path, keep=keep) as tmp:
        write_checkpoint(tmp, model, tokenizer, cfg, weights)
        if state is not None:
            torch.save(state, tmp / STATE)
    return path


def write_checkpoint(
    directory: Path,
    model: Any,
    tokenizer: Any,
    cfg: Config,
    weights: dict[str, torch.Tensor] | None = None,
    config_file: str = "train_config.json",
) -> None:
    """Write model (``weights`` instead of its own state dict when given: an FSDP model's
    gathered ones), tokenizer and ``cfg`` (as ``config_file``) into ``directory``."""
    model.save_pretrained(directory, state_dict=weights)
    tokenizer.save_pretrained(directory)
    (directory / config_file).write_text(json.dumps(cfg.to_dict(), indent=2))


def load_state(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's trainer state (written by this project: RNG states are pickled)."""
    state: dict[str, Any] = torch.load(checkpoint / STATE, weights_only=False)
    return state


def rng_state() -> dict[str, Any]:
    """The global RNG states a step may draw from: torch's and Python's (numpy's global one is
    not used: ruff's NPY002 keeps it out, and a loop's own ``numpy.random.Generator`` is saved
    by that loop)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any]) -> None:
    """Set the global RNGs back to :func:`rng_state`'s ``state``."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def interrupted_at(
    step: int,
    total: int | str,
    checkpoint: Path,
    save: Callable[[Path], object],
    metrics: MetricsLog,
) -> Interrupted:
    """The safe point after a signal: save step ``step`` to ``checkpoint`` (unless it is on disk
    already) and return the :class:`Interrupted` to raise, whose message says what was saved.
    ``total`` is the run's number of steps, or, for a run whose length is not counted in steps,
    how far it got (``"3,456/200,000 tokens"``). Before the first step there is nothing to
    save, and the log goes too: the directory does not count as used."""
    at = f"step {step}/{total}" if isinstance(total, int) else f"step {step} ({total})"
    if step == 0:
        metrics.close()
        metrics.path.unlink(missing_ok=True)
        return Interrupted(f"at {at}, before the first step; nothing saved")
    if not (checkpoint / STATE).is_file():
        save(checkpoint)
    return Interrupted(f"at {at}; saved {checkpoint}", resumable=True)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per line, flushed as written, so a checkpoint can note
    the file's :attr:`size`. A resumed run cuts the file back to that size (``keep``): the
    records of steps after the checkpoint go, nothing is lost or written twice."""

    def __init__(self, path: Path, keep: int = 0) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if keep:
            size = path.stat().st_size if path.is_file() else 0
            if size < keep:
                raise ValueError(
                    f"--resume: {path} holds {size} bytes, its checkpoint was written after {keep}"
                )
            os.truncate(path, keep)
            self.records = [json.loads(line) for line in path.read_text().splitlines()]
        self.file = path.open("a" if keep else "w")

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    @property
    def size(self) -> int:
        """Bytes on disk so far."""
        return os.fstat(self.file.fileno()).st_size

    def close(self) -> None:
        self.file.close()
