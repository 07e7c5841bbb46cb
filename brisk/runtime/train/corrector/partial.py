"""A corrector event store under construction (``.<name>.partial`` beside the store): the
complete decode batches, committed one at a time, so ``brisk train corrector collect`` stopped by
a signal or a kill continues with ``--resume`` to the store an uninterrupted collection writes
(:mod:`brisk.runtime.train.corrector.events` decodes the batches)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import Interrupted
from brisk.runtime.train.corrector.store import META, Entry
from brisk.runtime.train.resume import config_changes

__all__ = ["PROGRESS", "PartialStore", "refuse_complete"]

PROGRESS = "_progress.json"  # of a store under construction


def refuse_complete(out: Path) -> None:
    """An event store is written once: a complete one at ``out`` is an error (with or without
    ``--resume``: there is nothing left to collect)."""
    if out.exists():
        raise ValueError(
            f"--out: {out} already exists (an event store is written once); choose another --out"
        )


class PartialStore:
    """The store under construction, ``.<name>.partial``: the complete batches' block-log parts
    and feature rows, and ``_progress.json`` (written last, atomically: the commit point of a
    batch) with their counts, sizes and grades. A batch is decoded into ``staging/`` and
    appended when complete, so a signal or a kill loses at most that batch; whatever lies
    beyond the committed sizes is cut off when a run continues."""

    def __init__(self, out: Path, path: Path, progress: dict[str, Any]) -> None:
        self.out, self.path, self.progress = out, path, progress
        self.staging = path / "staging"

    @classmethod
    def open(cls, out: Path, settings: dict[str, Any], resume: bool) -> PartialStore:
        """Continue the partial store of ``out`` (``resume``) or start one; one that exists is
        refused without ``resume`` and with other ``settings`` (the differences named)."""
        path = out.with_name(f".{out.name}.partial")
        settings = json.loads(json.dumps(settings))  # as it reads back
        file = path / PROGRESS
        progress = json.loads(file.read_text()) if file.is_file() else None
        if progress is not None and progress["requests"]:
            done = f"{progress['requests']} of {settings['requests']} requests"
            if not resume:
                raise ValueError(
                    f"--out: {path} holds an interrupted collection into {out} ({done}); pass "
                    "--resume to continue it, or remove it to start again"
                )
            changes = config_changes(progress["settings"], settings)
            if changes:
                raise ValueError(
                    f"--resume: {path} was collected with other settings ({'; '.join(changes)}); "
                    "remove it to start again"
                )
            partial = cls(out, path, progress)
            partial._rollback()
            return partial
        shutil.rmtree(path, ignore_errors=True)  # nothing committed: nothing to keep
        (path / "blocks").mkdir(parents=True)
        (path / "features").mkdir()
        return cls(
            out,
            path,
            {
                "settings": settings,
                "batches": 0,
                "requests": 0,
                "events": 0,
                "files": {},
                "bytes": {},
                "correct": [],
                "tokens": [],
            },
        )

    requests = Entry("progress")  # committed so far
    events = Entry("progress")

    def commit(self, events: int, correct: list[bool], tokens: list[int]) -> None:
        """Append the staged batch: its block-log files renumbered after those already here
        (``part-NNNNNN``, ``requests-NNNNNN``), its feature rows to the feature files."""
        p = self.progress
        for file in sorted((self.staging / "blocks").glob("*-*.parquet")):
            kind, number = file.stem.rsplit("-", 1)
            first = p["files"].get(kind, 0)
            file.rename(
                self.path / "blocks" / f"{kind}-{first + int(number):0{len(number)}d}{file.suffix}"
            )
        counts: dict[str, int] = {}
        for file in (self.path / "blocks").glob("*-*.parquet"):
            kind = file.stem.rsplit("-", 1)[0]
            counts[kind] = counts.get(kind, 0) + 1
        for file in sorted((self.staging / "features").iterdir()):
            with (self.path / "features" / file.name).open("ab") as dst, file.open("rb") as src:
                shutil.copyfileobj(src, dst)
        p["bytes"] = {f.name: f.stat().st_size for f in (self.path / "features").iterdir()}
        p["files"] = counts
        p["batches"] += 1
        p["requests"] += len(correct)
        p["events"] += events
        p["correct"] += correct
        p["tokens"] += tokens
        atomic_write_text(self.path / PROGRESS, json.dumps(p))
        shutil.rmtree(self.staging)

    def _rollback(self) -> None:
        """Cut the store back to its last commit (what a kill during a commit left beyond)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        for file in (self.path / "blocks").iterdir():
            kind, _, number = file.stem.rpartition("-")
            if not (number.isdigit() and int(number) < self.progress["files"].get(kind, 0)):
                file.unlink()
        for file in (self.path / "features").iterdir():
            size = self.progress["bytes"].get(file.name, 0)
            if file.stat().st_size > size:
                os.truncate(file, size)

    def interrupted(self, total: int) -> Interrupted:
        """Discard the batch being decoded; the :class:`Interrupted` to raise says what stays."""
        shutil.rmtree(self.staging, ignore_errors=True)
        if not self.requests:
            shutil.rmtree(self.path, ignore_errors=True)
            return Interrupted(
                f"before the first batch was complete (0/{total} requests); nothing saved"
            )
        return Interrupted(
            f"after {self.requests}/{total} requests ({self.events} events); they stay in "
            f"{self.path}",
            resumable=True,
        )

    def finish(self, ids: list[int], meta: dict[str, Any]) -> None:
        """Write the request table and ``_events.json``, and rename the store into place."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        requests = pa.table(
            {
                "request_id": pa.array(ids, pa.int64()),
                "correct": pa.array(self.progress["correct"], pa.bool_()),
                "tokens": pa.array(self.progress["tokens"], pa.int32()),
            }
        )
        pq.write_table(requests, self.path / "requests.parquet")
        (self.path / META).write_text(json.dumps(meta, indent=2) + "\n")
        self.path.rename(self.out)
        (self.out / PROGRESS).unlink()
