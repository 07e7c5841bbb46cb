"""Corrector training events (``brisk train corrector collect``): policy-reached blocks of a frozen
backbone, with everything the head's forward needs and the verifier's targets.

An *event* is one verify round of the deployed decoder (ISD at stride N, temperature T, head
off, exact verification): the block the base proposed and what verification made of it. The
events are written as an event store (:mod:`brisk.runtime.train.event_store`: its layout, the
writer and the reader).

Collection writes into a hidden directory beside the store, ``.<name>.partial``, one decode
batch at a time (memory stays bounded by one batch): a batch's rows go to a staging directory
and are appended when the batch is complete, and the whole is renamed into place at the end, so
a store is either whole or absent. SIGINT or SIGTERM discards the batch being decoded and keeps
the complete ones, which ``--resume`` continues after, to the store an uninterrupted
collection writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import Interrupted, stop_signals
from brisk.runtime.train.corrector_config import CollectOptions
from brisk.runtime.train.event_store import FORMAT, META, EventStore, EventWriter
from brisk.runtime.train.resume import config_changes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from brisk.runtime.backbone import Backbone
    from brisk.runtime.isd.options import ISDOptions

__all__ = [
    "CollectOptions",
    "EventStore",
    "collect_events",
    "collect_from_checkpoint",
    "refuse_complete",
]

PROGRESS = "_progress.json"  # of a store under construction


def collect_events(
    backbone: Backbone,
    prompts: Sequence[Sequence[int]],
    options: ISDOptions,
    out: str | Path,
    *,
    seeds: Sequence[int] | None = None,
    request_ids: Sequence[int] | None = None,
    correct: Any = None,
    provenance: dict[str, Any] | None = None,
    feature_dtype: str = "float32",
    batch_size: int = 64,
    on_finish: Any = None,
    on_resume: Any = None,
    resume: bool = True,
) -> EventStore:
    """Decode ``prompts`` head-off with ``options`` and write an event store at ``out``.

    ``correct(r, output) -> bool`` grades request r (default: every response counts as correct);
    ``provenance`` is merged into ``_events.json``. ``out`` must not exist yet: the store is
    built in ``.<name>.partial`` beside it, one decode batch of ``batch_size`` requests at a
    time (the batches :func:`~brisk.runtime.isd.decode` would run), and renamed when complete.
    SIGINT or SIGTERM discards the batch being decoded and ends with
    :class:`~brisk._interrupt.Interrupted`; the complete batches stay, and ``resume`` (the
    library's default) continues after them to the store an uninterrupted run writes, while
    without it they are refused. ``on_resume(n)`` hears how many requests were collected before.
    """
    import torch

    from brisk.runtime.isd import decode

    out = Path(out)
    refuse_complete(out)
    K = min(options.top_k, backbone.vocab_size)
    n = len(prompts)
    ids = list(range(n)) if request_ids is None else list(request_ids)
    seeds = list(range(n)) if seeds is None else list(seeds)
    inputs = json.dumps([[[int(t) for t in p] for p in prompts], seeds, ids]).encode()
    settings = {  # what makes two runs collect the same store (the path aside: its hash counts)
        "provenance": {k: v for k, v in (provenance or {}).items() if k != "checkpoint"},
        "decoder": asdict(options),
        "K": K,
        "hidden_size": backbone.hidden_size,
        "feature_dtype": feature_dtype,
        "batch_size": batch_size,
        "requests": n,
        "inputs": hashlib.sha256(inputs).hexdigest(),
    }
    partial = _Partial.open(out, settings, resume)
    if on_resume is not None and partial.requests:
        on_resume(partial.requests)
    grades: dict[int, bool] = {}
    lo = partial.requests  # the first request of the batch being decoded

    def finished(r: int, output: Any) -> None:
        grades[lo + r] = True if correct is None else bool(correct(lo + r, output))
        if on_finish is not None:
            on_finish(lo + r, output)

    with stop_signals() as stop:
        for lo in range(partial.requests, n, batch_size):  # finished() reads lo
            # Between batches: stop on SIGINT/SIGTERM; the committed batches stay.
            if stop.requested:
                raise partial.interrupted(n)
            # A batch: decoded into staging/, thrown away if a signal cuts it short.
            hi = min(lo + batch_size, n)
            writer = EventWriter(partial.staging, options.M, K, backbone.hidden_size, feature_dtype)
            try:
                with (
                    writer,
                    stop.abortable(),
                    torch.inference_mode(),
                ):  # closed before `except` runs
                    result = decode(
                        backbone,
                        prompts[lo:hi],
                        options,
                        seeds=seeds[lo:hi],
                        request_ids=ids[lo:hi],
                        logger=writer,
                        batch_size=batch_size,
                        on_finish=finished,
                        fit_positions=True,  # a long prompt decodes what fits after it
                    )
            except KeyboardInterrupt:
                raise partial.interrupted(n) from None
            partial.commit(
                writer.events, [grades[r] for r in range(lo, hi)], [len(t) for t in result.tokens]
            )
    meta = {
        "format": FORMAT,
        **(provenance or {}),
        "hidden_size": backbone.hidden_size,
        "vocab_size": backbone.vocab_size,
        "M": options.M,
        "K": K,
        "stride": options.stride,
        "temperature": options.temperature,
        "feature_dtype": feature_dtype,
        "events": partial.events,
        "requests": n,
    }
    partial.finish(ids, meta)
    return EventStore.open(out)


def refuse_complete(out: Path) -> None:
    """An event store is written once: a complete one at ``out`` is an error (with or without
    ``--resume``: there is nothing left to collect)."""
    if out.exists():
        raise ValueError(
            f"--out: {out} already exists (an event store is written once); choose another --out"
        )


class _Partial:
    """The store under construction, ``.<name>.partial``: the complete batches' block-log parts
    and feature rows, and ``_progress.json`` (written last, atomically: the commit point of a
    batch) with their counts, sizes and grades. A batch is decoded into ``staging/`` and
    appended when complete, so a signal or a kill loses at most that batch; whatever lies
    beyond the committed sizes is cut off when a run continues."""

    def __init__(self, out: Path, path: Path, progress: dict[str, Any]) -> None:
        self.out, self.path, self.progress = out, path, progress
        self.staging = path / "staging"

    @classmethod
    def open(cls, out: Path, settings: dict[str, Any], resume: bool) -> _Partial:
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

    @property
    def requests(self) -> int:
        return int(self.progress["requests"])

    @property
    def events(self) -> int:
        return int(self.progress["events"])

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


def collect_from_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    options: CollectOptions,
    show_progress: bool = True,
    *,
    resume: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> EventStore:
    """Events of a checkpoint on the training problems of ``options.task`` (by default the world
    it was trained on), each response graded by the task's grader (interruption and ``resume``
    as in :func:`collect_events`); the model runs on ``device`` in ``dtype``
    (:func:`brisk.runtime.loader.placement`)."""
    from rich.progress import Progress

    from brisk.runtime.prompts import completion_text, encode_prompts
    from brisk.runtime.train.selfgen import checkpoint_hash, deployed_decoder, tokenizer_hash

    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise ValueError(f"--checkpoint: {checkpoint} is not a directory")
    task = options.task.resolve(
        n=options.problems, seed=options.problem_seed, split="train", checkpoint=checkpoint
    )
    refuse_complete(Path(out))  # before loading the model
    tokenizer, backbone, dec = deployed_decoder(checkpoint, options, device=device, dtype=dtype)
    problems = task.problems(tokenizer)
    if not problems:
        raise ValueError("--task: the selection holds no problems")
    index = [(i, s) for i in range(len(problems)) for s in range(options.samples)]
    prompts = encode_prompts(tokenizer, [problems[i].prompt for i, _ in index])
    seeds = [options.decode_seed(i, s) for i, s in index]

    def correct(r: int, output: Any) -> bool:  # a grader that raises counts as wrong
        text = completion_text(tokenizer, output.tokens)
        return task.grade([problems[index[r][0]]], [text], workers=1).correct[0] is True

    provenance = {
        "checkpoint": str(checkpoint),
        "checkpoint_hash": checkpoint_hash(checkpoint),
        "tokenizer_hash": tokenizer_hash(checkpoint),
        "task": task.describe(),
        "decoder": {"algorithm": "isd", "head": "off"},
        "options": asdict(options),
    }
    with Progress(disable=not show_progress) as progress:
        bar = progress.add_task("collect", total=len(index))
        return collect_events(
            backbone,
            prompts,
            dec,
            out,
            seeds=seeds,
            correct=correct,
            provenance=provenance,
            feature_dtype=options.feature_dtype,
            batch_size=options.batch_size,
            on_finish=lambda _r, _o: progress.advance(bar),
            on_resume=lambda n: progress.advance(bar, n),
            resume=resume,
        )
