"""Corrector training events (``brisk train corrector collect``): policy-reached blocks of a frozen
backbone, with everything the head's forward needs and the verifier's targets.

An *event* is one verify round of the deployed decoder (ISD at stride N, temperature T, head
off, exact verification): the block the base proposed and what verification made of it. An
event store is a directory::

    _events.json      provenance: checkpoint and tokenizer hashes, sizes (H, V, M, K), decoder
                      options, feature dtype, the number of events; written last
    blocks/           the block log (brisk.mechanism's Parquet format, one row per event):
                      anchor x_0, Top-K candidates C_i, q and the verifier's p over them (p
                      under the block's own recorded prefix, NaN after the first rejection),
                      the base's choices, L, request id, block index, token offset
    features/         what the log lacks, one fixed-size row per event, raw little-endian so it
                      can be memory-mapped: anchor_hidden [n, H], mask_hidden [n, M, H] (float32
                      or float16), cand_logits [n, M, K] (float32: the base logits of C_i,
                      descending), keys [n, 2] (int64 request id and block index: aligns the rows
                      with the log)
    requests.parquet  one row per decoded response: request id, problem, sample, correct

Collection writes into a hidden directory beside the store, ``.<name>.partial``, one decode
batch at a time (memory stays bounded by one batch): a batch's rows go to a staging directory
and are appended when the batch is complete, and the whole is renamed into place at the end, so
a store is either whole or absent. SIGINT or SIGTERM discards the batch being decoded and keeps
the complete ones, which ``--resume`` continues after, to the store an uninterrupted
collection writes. The head's training then streams the feature files through
``numpy.memmap``. The Top-K of q is a prefix of the Top-K' of q for K < K', so one store
collected at K' serves heads of every K ≤ K' (they read the leading K candidates).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from brisk._atomic import atomic_write_text
from brisk._interrupt import Interrupted, stop_signals
from brisk.runtime.blocklog import BlockLogger, BlockRecord
from brisk.runtime.train.corrector_config import FEATURE_DTYPES, CollectOptions
from brisk.runtime.train.resume import config_changes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from brisk.runtime.backbone import Backbone
    from brisk.runtime.isd.batched import Draft
    from brisk.runtime.isd.options import ISDOptions

__all__ = [
    "CollectOptions",
    "EventStore",
    "EventWriter",
    "collect_events",
    "collect_from_checkpoint",
]

META = "_events.json"
PROGRESS = "_progress.json"  # of a store under construction
FORMAT = "brisk-corrector-events/1"


def _feature_shapes(meta: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-event shape and dtype of every feature file."""
    H, M, K = meta["hidden_size"], meta["M"], meta["K"]
    dtype = meta["feature_dtype"]
    return {
        "anchor_hidden": ((H,), dtype),
        "mask_hidden": ((M, H), dtype),
        "cand_logits": ((M, K), "float32"),
        "keys": ((2,), "int64"),
    }


class EventWriter(BlockLogger):
    """A block logger that also appends the head's inputs of every verified block."""

    collects = True

    def __init__(
        self, path: str | Path, M: int, K: int, hidden_size: int, feature_dtype: str = "float32"
    ) -> None:
        if feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype: one of {FEATURE_DTYPES}, got {feature_dtype!r}")
        path = Path(path)
        super().__init__(path / "blocks", M, K)
        self.hidden_size, self.feature_dtype = hidden_size, feature_dtype
        self.meta = {"hidden_size": hidden_size, "M": M, "K": K, "feature_dtype": feature_dtype}
        (path / "features").mkdir(parents=True, exist_ok=True)
        self._files: dict[str, BinaryIO] = {
            name: open(path / "features" / f"{name}.bin", "wb")  # noqa: SIM115 (closed in close)
            for name in _feature_shapes(self.meta)
        }
        self.events = 0

    def log_round(self, record: BlockRecord, draft: Draft) -> None:
        if draft.mask_hidden is None or draft.anchor_hidden is None or draft.cand_logits is None:
            raise ValueError("draft: proposed without collect=True (no head inputs kept)")
        self.log(record)
        keys = np.stack(
            [record.request_id.cpu().numpy(), record.block_index.cpu().numpy()], 1
        ).astype(np.int64)
        rows = {
            "anchor_hidden": draft.anchor_hidden,
            "mask_hidden": draft.mask_hidden,
            "cand_logits": draft.cand_logits,
        }
        shapes = _feature_shapes(self.meta)
        for name, tensor in rows.items():
            array = tensor.detach().float().cpu().numpy().astype(shapes[name][1])
            if not np.isfinite(array).all():  # e.g. a hidden-state outlier beyond float16's range
                raise ValueError(
                    f"{name}: non-finite values as {shapes[name][1]} (largest magnitude "
                    f"{float(tensor.abs().max()):.4g}); collect with feature_dtype='float32'"
                )
            self._files[name].write(array.astype(array.dtype.newbyteorder("<")).tobytes())
        self._files["keys"].write(keys.astype("<i8").tobytes())
        self.events += len(keys)

    def close(self) -> None:
        super().close()
        for f in self._files.values():
            if not f.closed:
                f.close()


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
        "decoder": asdict(options), "K": K,
        "hidden_size": backbone.hidden_size, "feature_dtype": feature_dtype,
        "batch_size": batch_size, "requests": n, "inputs": hashlib.sha256(inputs).hexdigest(),
    }  # fmt: skip
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
            writer = EventWriter(partial.staging, options.M, K, backbone.hidden_size,
                                 feature_dtype)  # fmt: skip
            try:
                with (
                    writer,
                    stop.abortable(),
                    torch.inference_mode(),
                ):  # closed before `except` runs
                    result = decode(backbone, prompts[lo:hi], options, seeds=seeds[lo:hi],
                                    request_ids=ids[lo:hi], logger=writer,
                                    batch_size=batch_size, on_finish=finished)  # fmt: skip
            except KeyboardInterrupt:
                raise partial.interrupted(n) from None
            partial.commit(writer.events, [grades[r] for r in range(lo, hi)],
                           [len(t) for t in result.tokens])  # fmt: skip
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
        return cls(out, path, {"settings": settings, "batches": 0, "requests": 0, "events": 0,
                          "files": {}, "bytes": {}, "correct": [], "tokens": []})  # fmt: skip

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
            file.rename(self.path / "blocks" / f"{kind}-{first + int(number):0{len(number)}d}"
                        f"{file.suffix}")  # fmt: skip
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
            return Interrupted(f"before the first batch was complete (0/{total} requests); "
                               "nothing saved")  # fmt: skip
        return Interrupted(
            f"after {self.requests}/{total} requests ({self.events} events); they stay in "
            f"{self.path}",
            resumable=True,
        )

    def finish(self, ids: list[int], meta: dict[str, Any]) -> None:
        """Write the request table and ``_events.json``, and rename the store into place."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        requests = pa.table({
            "request_id": pa.array(ids, pa.int64()),
            "correct": pa.array(self.progress["correct"], pa.bool_()),
            "tokens": pa.array(self.progress["tokens"], pa.int32()),
        })  # fmt: skip
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
    task = options.task.resolve(n=options.problems, seed=options.problem_seed, split="train",
                                checkpoint=checkpoint)  # fmt: skip
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
            backbone, prompts, dec, out, seeds=seeds, correct=correct, provenance=provenance,
            feature_dtype=options.feature_dtype, batch_size=options.batch_size,
            on_finish=lambda _r, _o: progress.advance(bar),
            on_resume=lambda n: progress.advance(bar, n), resume=resume,
        )  # fmt: skip


@dataclass(frozen=True)
class EventStore:
    """An event store opened for training: log columns in memory, features memory-mapped.

    Arrays, n events: ``anchor`` [n], ``cand_ids`` [n, M, K] int64, ``p`` / ``q`` [n, M, K]
    (p NaN where not reached), ``base_choice`` [n, M], ``accept_len`` [n], ``request_id`` [n],
    ``correct`` [n] (the event's response was graded correct); memory-mapped ``anchor_hidden``
    [n, H], ``mask_hidden`` [n, M, H], ``cand_logits`` [n, M, K].
    """

    path: Path
    meta: dict[str, Any]
    anchor: np.ndarray
    cand_ids: np.ndarray
    p: np.ndarray
    q: np.ndarray
    base_choice: np.ndarray
    accept_len: np.ndarray
    request_id: np.ndarray
    correct: np.ndarray
    anchor_hidden: np.ndarray
    mask_hidden: np.ndarray
    cand_logits: np.ndarray

    @property
    def M(self) -> int:
        return int(self.meta["M"])

    @property
    def K(self) -> int:
        return int(self.meta["K"])

    @property
    def hidden_size(self) -> int:
        return int(self.meta["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def __len__(self) -> int:
        return len(self.anchor)

    @classmethod
    def open(cls, path: str | Path) -> EventStore:
        """Open and check a store; every error names the file and what is wrong."""
        import pyarrow.parquet as pq

        from brisk.mechanism.io import read_blocks

        path = Path(path)
        meta_file = path / META
        if not meta_file.is_file():
            raise ValueError(f"{path}: not a corrector event store (no {META}; was collection "
                             "interrupted?)")  # fmt: skip
        try:
            meta = json.loads(meta_file.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{meta_file}: invalid JSON ({err.msg})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{meta_file}: not a {FORMAT} file")
        n = int(meta["events"])
        if n == 0:
            raise ValueError(f"{meta_file}: the store holds no events")
        features: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in _feature_shapes(meta).items():
            file = path / "features" / f"{name}.bin"
            row = int(np.prod(shape)) * np.dtype(dtype).itemsize
            size = file.stat().st_size if file.is_file() else -1
            if size != n * row:
                found = "missing" if size < 0 else f"{size} bytes"
                raise ValueError(
                    f"{file}: {found}, expected {n * row} ({n} events × {row} bytes; truncated "
                    "or from another store)"
                )
            features[name] = np.memmap(file, dtype=np.dtype(dtype).newbyteorder("<"), mode="r",
                                       shape=(n, *shape))  # fmt: skip
        columns = ["request_id", "block_index", "anchor", "cand_ids", "q", "p", "base_choice",
                   "accept_len"]  # fmt: skip
        batches = list(read_blocks(path / "blocks", columns=columns, prefetch=False))
        log = {c: np.concatenate([b[c] for b in batches]) for c in columns}
        if len(log["anchor"]) != n:
            raise ValueError(f"{path / 'blocks'}: {len(log['anchor'])} rows, {meta_file} says {n}")
        if log["cand_ids"].shape[1:] != (meta["M"], meta["K"]):
            raise ValueError(f"{path / 'blocks'}: M, K = {log['cand_ids'].shape[1:]}, "
                             f"{meta_file} says {meta['M']}, {meta['K']}")  # fmt: skip
        keys = np.stack([log["request_id"], log["block_index"]], 1)
        if not np.array_equal(keys, np.asarray(features["keys"])):
            bad = int(np.argmax((keys != np.asarray(features["keys"])).any(1)))
            raise ValueError(
                f"{path / 'features' / 'keys.bin'}: row {bad} is not the log's row {bad} "
                "(features and block log out of step)"
            )
        requests = pq.read_table(path / "requests.parquet").to_pydict()
        good = {r for r, ok in zip(requests["request_id"], requests["correct"], strict=True) if ok}
        return cls(
            path=path, meta=meta, anchor=log["anchor"].astype(np.int64),
            cand_ids=log["cand_ids"].astype(np.int64), p=log["p"].astype(np.float32),
            q=log["q"].astype(np.float32), base_choice=log["base_choice"].astype(np.int64),
            accept_len=log["accept_len"].astype(np.int64),
            request_id=log["request_id"].astype(np.int64),
            correct=np.isin(log["request_id"], list(good)),
            anchor_hidden=features["anchor_hidden"], mask_hidden=features["mask_hidden"],
            cand_logits=features["cand_logits"],
        )  # fmt: skip

    def check_backbone(self, backbone: Backbone) -> None:
        """The store must come from a backbone of this hidden size and vocabulary."""
        if (backbone.hidden_size, backbone.vocab_size) != (self.hidden_size, self.vocab_size):
            raise ValueError(
                f"{self.path / META}: events of a backbone with hidden {self.hidden_size} / vocab "
                f"{self.vocab_size}, this one has {backbone.hidden_size} / {backbone.vocab_size}"
            )
