"""Self-generated training data (``brisk train selfgen``): the deployed decoder's own samples.

For each of ``n`` distinct training problems of a task
(:class:`~brisk.runtime.tasks.spec.TaskSpec`: by default the world the checkpoint was trained
on, its train split; or a user's data file with its prompt format and grader), ``R`` responses
are decoded from a checkpoint with ISD at stride N and temperature T (head off, exact
verification), graded by the task's grader (normalized answer matching) and written as a
Parquet dataset: a directory of ``part-NNNNN.parquet`` files, one per chunk of problems,
readable by ``pandas.read_parquet(DIR)`` and by ``datasets.load_dataset("parquet",
data_files="DIR/*.parquet")``. Columns:

``problem`` (index of the problem), ``sample`` (0..R−1), ``seed`` (the decode seed of the
response), ``prompt``, ``response`` (text, EOS removed), ``answer`` (the reference answer),
``correct``, ``finished`` ("eos" or "length"), ``accept_lengths`` (L of every verify round) and
``reached`` / ``accepted`` (the response's acceptance counts per proposal position under the
native ISD rule: positions after the first rejection are not reached).

Provenance (checkpoint hash, tokenizer and chat-template hash, decoder options, the task: the
world's settings or the data file's sha256, fields, format and grader) is written to
``_provenance.json`` before the first part and into every part's schema metadata. Parts are
written to a temporary file and renamed, so a kill loses at most the chunk being decoded; SIGINT
or SIGTERM discards that chunk at once and ends with :class:`~brisk._interrupt.Interrupted`.
With ``resume`` (the library's default, which the experiments rely on) a rerun into the same
directory continues after the last complete part, to the dataset an uninterrupted run writes;
without it a directory holding parts is refused, and either way one whose parts were made with
other settings is (the differences named).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brisk._atomic import atomic_write, atomic_write_text
from brisk._interrupt import Interrupted, stop_signals
from brisk._json import read_json_object
from brisk.runtime.tasks.spec import ResolvedTask, task_from_description
from brisk.runtime.train.fields import ProblemSampling, counts

__all__ = [
    "SelfGenOptions",
    "SelfGenResult",
    "checkpoint_hash",
    "dataset_profile",
    "generate_dataset",
    "provenance_task",
    "read_dataset",
    "read_provenance",
    "tokenizer_hash",
]

PROVENANCE = "_provenance.json"  # "_" so Parquet readers skip it
META_KEY = b"brisk.selfgen"
FORMAT = "brisk-selfgen/2"  # 2: the task described (a world or a data file); 1: a world's config


@dataclass(frozen=True)
class SelfGenOptions(ProblemSampling):
    """What to sample: ``problems`` problems of ``task`` (seed ``problem_seed``), ``samples``
    each, written ``chunk`` problems per part."""

    chunk: int = 64  # problems per part (the unit of resumption)

    def __post_init__(self) -> None:
        counts(self, "chunk")
        super().__post_init__()


def _hash_files(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def checkpoint_hash(checkpoint: str | Path) -> str:
    """sha256 (16 hex digits) over a checkpoint's weights and config files."""
    path = Path(checkpoint)
    files = [*path.glob("*.safetensors"), *path.glob("*.bin"), path / "config.json"]
    files = [f for f in files if f.is_file()]
    if not files:
        raise ValueError(f"{path}: no model weights (*.safetensors) or config.json")
    return _hash_files(files)


def tokenizer_hash(checkpoint: str | Path) -> str:
    """sha256 (16 hex digits) over the tokenizer's files and its chat template (a dataset made
    with another tokenizer or chat format is refused for a model)."""
    path = Path(checkpoint)
    files = [*path.glob("tokenizer*.json"), *path.glob("chat_template*.jinja")]
    files = [f for f in files if f.is_file()]
    return _hash_files(files) if files else ""


@dataclass(frozen=True)
class SelfGenResult:
    out: Path
    rows: int
    correct: int
    parts_written: int
    parts_skipped: int
    grader_errors: int = 0  # responses the grader raised on (counted wrong)
    first_grader_error: str | None = None


def resolve_task(checkpoint: Path, options: SelfGenOptions) -> ResolvedTask:
    """The task ``options`` sample from: its ``problems`` drawn with ``problem_seed``, the
    train split of a world."""
    return options.task.resolve(
        n=options.problems, seed=options.problem_seed, split="train", checkpoint=checkpoint
    )


def _provenance(checkpoint: Path, options: SelfGenOptions, task: ResolvedTask) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "checkpoint": str(checkpoint),
        "checkpoint_hash": checkpoint_hash(checkpoint),
        "tokenizer_hash": tokenizer_hash(checkpoint),
        "task": task.describe(),
        "decoder": {
            "algorithm": "isd",
            "head": "off",
            "stride": options.stride,
            "M": options.stride - 1,
            "temperature": options.temperature,
            "top_k": options.top_k,
            "max_new_tokens": options.max_new_tokens,
        },
        "options": asdict(options),
    }


def provenance_task(provenance: dict[str, Any]) -> ResolvedTask:
    """The task a dataset's problems were drawn from (format 1 recorded only a world's config:
    its train split, ``problems`` drawn with ``problem_seed``)."""
    if provenance.get("format") == "brisk-selfgen/1":
        options = provenance["options"]
        world = {
            "name": "arithmetic",
            "config": provenance["task"],
            "split": "train",
            "n": options["problems"],
            "seed": options["problem_seed"],
            "grader": "gsm8k",
        }
        return task_from_description(world)
    return task_from_description(provenance["task"])


def read_provenance(out: str | Path) -> dict[str, Any]:
    """The ``_provenance.json`` of a self-generated dataset (errors name the file)."""
    file = Path(out) / PROVENANCE
    if not file.is_file():
        raise ValueError(f"{out}: not a self-generated dataset (no {PROVENANCE})")
    data = read_json_object(file)
    if data.get("format") not in (FORMAT, "brisk-selfgen/1"):
        raise ValueError(f"{file}: not a {FORMAT} provenance file")
    return data


def generate_dataset(
    checkpoint: str | Path,
    out: str | Path,
    options: SelfGenOptions,
    show_progress: bool = True,
    *,
    resume: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> SelfGenResult:
    """Decode, grade and write the dataset (module docstring); ``resume`` continues an
    interrupted run. The model runs on ``device`` in ``dtype``
    (:func:`brisk.runtime.loader.placement`: the GPU in bfloat16 where one exists)."""
    import pyarrow.parquet as pq
    import torch
    from rich.progress import Progress

    from brisk.runtime.isd import decode
    from brisk.runtime.prompts import encode_prompts

    checkpoint, out = Path(checkpoint), Path(out)
    if not checkpoint.is_dir():
        raise ValueError(f"--checkpoint: {checkpoint} is not a directory")
    from brisk.runtime.loader import checkpoint_mask_id, load_tokenizer

    task = resolve_task(checkpoint, options)
    tokenizer = load_tokenizer(checkpoint, where="--checkpoint")
    # a MASK id that cannot be is refused before the dataset directory is claimed
    checkpoint_mask_id(checkpoint, options.mask_token_id, tokenizer=tokenizer, where="--checkpoint")
    problems = task.problems(tokenizer)
    if not problems:
        raise ValueError("--task: the selection holds no problems")
    provenance = json.loads(json.dumps(_provenance(checkpoint, options, task)))  # as read back
    _claim(out, provenance, options, resume, len(problems))

    tokenizer, backbone, dec = deployed_decoder(checkpoint, options, device=device, dtype=dtype)
    _check_fit(tokenizer, problems, backbone.max_positions, options.stride)
    R = options.samples
    meta = {META_KEY: json.dumps(provenance).encode()}
    chunks = range(0, len(problems), options.chunk)
    rows = correct = written = skipped = errors = 0
    first_error: str | None = None
    with stop_signals() as stop, Progress(disable=not show_progress) as progress:
        bar = progress.add_task("selfgen", total=len(problems) * R)
        for c, lo in enumerate(chunks):
            part = out / f"part-{c:05d}.parquet"
            chunk = problems[lo : lo + options.chunk]
            if part.exists():
                n = pq.ParquetFile(part).metadata.num_rows
                if n != len(chunk) * R:
                    raise ValueError(f"{part}: holds {n} rows, expected {len(chunk) * R}")
                rows += n
                correct += int(np.sum(pq.read_table(part, columns=["correct"])["correct"]))
                skipped += 1
                progress.advance(bar, n)
                continue

            # Between parts: stop on SIGINT/SIGTERM; the complete parts stay.
            if stop.requested:
                raise _interrupted(out, c, len(chunks), rows)
            # A chunk: decoded at once, thrown away if a signal cuts it short.
            index = [(lo + i, r) for i in range(len(chunk)) for r in range(R)]
            prompts = encode_prompts(tokenizer, [problems[i].prompt for i, _ in index])
            seeds = [options.decode_seed(i, r) for i, r in index]
            try:
                with stop.abortable(), torch.inference_mode():
                    result = decode(
                        backbone,
                        prompts,
                        dec,
                        seeds=seeds,
                        request_ids=seeds,
                        batch_size=options.batch_size,
                        on_finish=lambda _r, _o: progress.advance(bar),
                        fit_positions=True,  # a long prompt decodes what fits after it
                    )
            except KeyboardInterrupt:
                raise _interrupted(out, c, len(chunks), rows) from None
            table, grades = _part(tokenizer, task, problems, index, seeds, result, dec.M)
            errors += grades.errors
            first_error = first_error or grades.first_error
            whole = table.replace_schema_metadata(meta)
            # a part is on disk whole or not at all (a full disk leaves no temporary file)
            atomic_write(part, lambda tmp, whole=whole: pq.write_table(whole, tmp))
            rows += len(index)
            correct += sum(table["correct"].to_pylist())
            written += 1
    return SelfGenResult(out, rows, correct, written, skipped, errors, first_error)


def _claim(
    out: Path, provenance: dict[str, Any], options: SelfGenOptions, resume: bool, n_problems: int
) -> None:
    """Make ``out`` the dataset's directory: a new one, or one holding no part yet (a run
    refused or stopped before its first part), gets the provenance; one whose parts were made
    with other settings is refused, and one holding parts unless ``resume``."""
    out.mkdir(parents=True, exist_ok=True)
    for tmp in out.glob(".part-*.tmp"):  # what a kill during a write left
        tmp.unlink()
    from brisk.runtime.train.resume import config_changes

    parts, total = len(list(out.glob("part-*.parquet"))), -(-n_problems // options.chunk)
    if (out / PROVENANCE).exists() and parts:  # without a part it holds no dataset to keep
        old = read_provenance(out)
        changes = config_changes({**old, "checkpoint": None}, {**provenance, "checkpoint": None})
        if changes:
            raise ValueError(
                f"--out: {out} holds a dataset made with another checkpoint or other options "
                f"({'; '.join(changes)}); use a new directory"
            )
    else:
        atomic_write_text(out / PROVENANCE, json.dumps(provenance, indent=2))
    if parts and not resume:
        held = "a complete dataset" if parts == total else f"a dataset ({parts} of {total} parts)"
        way_out = "" if parts == total else "pass --resume to continue it or "
        raise ValueError(f"--out: {out} already holds {held}; {way_out}choose another --out")


def _check_fit(tokenizer: Any, problems: list[Any], limit: int | None, stride: int) -> None:
    """That every prompt leaves the model's positions room for a token and ISD's 2M slots
    (decode shortens a long prompt's budget to what fits, but a prompt with no room cannot
    decode): one line naming ``--task`` and the first problem that does not fit."""
    from brisk.runtime.prompts import encode_prompt

    if limit is None:
        return
    room = limit - 1 - 2 * (stride - 1)
    for p in problems:
        n = len(encode_prompt(tokenizer, p.prompt))
        if n > room:
            raise ValueError(
                f"--task: problem {p.id}'s prompt is {n} tokens; at stride {stride} the model's "
                f"{limit} positions take prompts of at most {room}"
            )


def _interrupted(out: Path, done: int, total: int, rows: int) -> Interrupted:
    if not done:
        return Interrupted(f"before the first part was complete (0/{total}); nothing saved")
    return Interrupted(
        f"after {done}/{total} parts ({rows} responses); they stay in {out}", resumable=True
    )


def _part(
    tokenizer: Any,
    task: ResolvedTask,
    problems: list[Any],
    index: list[tuple[int, int]],
    seeds: list[int],
    result: Any,
    M: int,
) -> tuple[Any, Any]:
    """A chunk's graded responses as a Parquet table (the columns of the module docstring) and
    their grades; a response the grader raised on counts as wrong."""
    import pyarrow as pa

    from brisk.runtime.prompts import completion_text

    texts = [completion_text(tokenizer, t) for t in result.tokens]
    graded = task.grade([problems[i] for i, _ in index], texts)
    profiles = [req.profile(M) for req in result.requests]
    table = pa.table(
        {
            "problem": pa.array([i for i, _ in index], pa.int32()),
            "sample": pa.array([r for _, r in index], pa.int16()),
            "seed": pa.array(seeds, pa.int64()),
            "prompt": [problems[i].prompt for i, _ in index],
            "response": texts,
            "answer": [str(problems[i].answer) for i, _ in index],
            "correct": pa.array([g is True for g in graded.correct], pa.bool_()),
            "finished": [req.finished for req in result.requests],
            "accept_lengths": pa.array(
                [req.accept_lengths for req in result.requests], pa.list_(pa.int8())
            ),
            "reached": pa.array([p.reached.tolist() for p in profiles], pa.list_(pa.int32(), M)),
            "accepted": pa.array([p.accepted.tolist() for p in profiles], pa.list_(pa.int32(), M)),
        }
    )
    return table, graded


def deployed_decoder(
    checkpoint: str | Path, options: Any, *, device: str | None = None, dtype: str | None = None
) -> tuple[Any, Any, Any]:
    """The tokenizer, the backbone (eval mode, on ``device`` in ``dtype``: the one loader,
    :func:`brisk.runtime.loader.load_model`, with ``options``' MASK id) and the ISD options
    (head off, stopping at the tokenizer's EOS) that sample from ``checkpoint`` with
    ``options``' stride, temperature, Top-K and token budget."""
    from brisk.runtime.loader import load_model

    loaded = load_model(
        checkpoint,
        device=device,
        dtype=dtype,
        mask_token_id=options.mask_token_id,
        where="--checkpoint",
    )
    dec = options.decode_options(loaded.tokenizer.eos_token_id)
    return loaded.tokenizer, loaded.backbone, dec


def read_dataset(out: str | Path) -> Any:
    """The dataset as a pyarrow Table (all parts, in order); errors name the directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    read_provenance(out)
    parts = sorted(Path(out).glob("part-*.parquet"))
    if not parts:
        raise ValueError(f"{out}: the dataset has no parts (was generation interrupted early?)")
    tables = []
    for part in parts:
        try:
            table = pq.read_table(part)
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"{part}: not a readable Parquet part ({_one_line(err)})") from None
        if tables and not table.schema.equals(tables[0].schema):
            raise ValueError(f"{part}: its columns are not the dataset's ({parts[0].name}'s)")
        missing = [c for c in ("prompt", "response", "correct") if c not in table.column_names]
        if missing:
            raise ValueError(f"{part}: no column {missing[0]!r}: not a self-generated part")
        tables.append(table)
    return pa.concat_tables(tables)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def dataset_profile(table: Any, M: int) -> Any:
    """The acceptance profile of a dataset's rows (sum of their per-response counts)."""
    from brisk.theory import AcceptanceProfile

    reached = np.asarray(table["reached"].to_pylist(), np.int64).reshape(-1, M).sum(0)
    accepted = np.asarray(table["accepted"].to_pylist(), np.int64).reshape(-1, M).sum(0)
    return AcceptanceProfile(reached, accepted)
