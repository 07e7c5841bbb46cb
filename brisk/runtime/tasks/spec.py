"""Which problems a command runs on, as a config value: :class:`TaskSpec`.

Every command that samples, trains or evaluates on problems takes one (``--task`` and the flags
beside it, or a ``[selfgen.task]`` / ``[eval.task]`` table in an experiment's config):

- **empty** (the default): the world the checkpoint was trained on, read from its
  ``train_config.json`` (:func:`~brisk.runtime.tasks.task.checkpoint_task`; its ``train`` or
  ``test`` split as the command needs);
- **a registered task** by name (``arithmetic``, with ``preset`` ``tiny`` / ``paper`` /
  ``trivial``);
- **a data file or directory** (``path``): a :class:`~brisk.runtime.tasks.sources.Source` with
  ``fields`` (``role=column``), prompted by ``format`` / ``template`` / ``system`` /
  ``thinking`` and graded by ``grader``.

A command asks for ``n`` problems drawn with ``seed``: a registered world draws them; from a file
the selection (``start:stop`` of ``split``) is used whole when it has at most ``n`` rows, else
``n`` of its rows are sampled with ``seed`` and kept in file order. The resolved task describes
itself (:meth:`ResolvedTask.describe`: the world's settings, or the file's sha256, its fields,
format and grader) for the provenance of what a command writes, and :func:`task_from_description`
rebuilds it from there, refusing a file that has changed since.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from brisk.runtime.configs import Config
from brisk.runtime.tasks.formats import PromptFormat
from brisk.runtime.tasks.graders import Grades
from brisk.runtime.tasks.sources import Source, read_records
from brisk.runtime.tasks.task import Problem, Task, checkpoint_task, get_task, rebuild_task

__all__ = [
    "ResolvedTask",
    "TaskSpec",
    "file_sha256",
    "task_flag_errors",
    "task_from_description",
]


class ResolvedTask(Protocol):
    """What commands use of a task."""

    def problems(self, tokenizer: Any = None) -> list[Problem]: ...

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades: ...

    def describe(self) -> dict[str, Any]: ...

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]: ...


@dataclass(frozen=True)
class TaskSpec(Config):
    """Which problems, how they are prompted and graded (module docstring)."""

    name: str = ""  # a registered task (e.g. arithmetic); empty with no path: the checkpoint's
    preset: str = ""  # the registered world's preset (arithmetic: tiny, paper, trivial)
    path: str = ""  # a JSONL / Parquet / CSV file or a local datasets directory
    # role=column pairs, e.g. prompt=question,answer=answer (none: prompt=prompt,answer=answer)
    fields: tuple[str, ...] = ()
    kind: str = "auto"  # the file's format (auto: from the name)
    split: str = ""  # the dataset split (a DatasetDict) or the world's split (train, test)
    start: int = 0  # first row of the selection
    stop: int = -1  # row after the selection's last (-1: the end)
    format: Literal["raw", "chat"] = "raw"  # raw template or the tokenizer's chat template
    template: str = "{prompt}"  # the prompt's text, {role} / {column} filled from the record
    system: str = ""  # chat: the system prompt
    thinking: Literal["", "on", "off"] = ""  # chat: enable_thinking (empty: the template's)
    # exact, gsm8k, numeric, math, code or module:function (empty: exact when there are answers)
    grader: str = ""

    def __post_init__(self) -> None:
        if self.name and self.path:
            raise ValueError(f"task: a registered name ({self.name!r}) or a path, not both")
        for pair in self.fields:
            if pair.count("=") != 1 or not all(pair.split("=")):
                raise ValueError(f"fields: expected role=column, got {pair!r}")
        if self.start < 0 or (self.stop != -1 and self.stop < self.start):
            raise ValueError(f"start, stop: need 0 ≤ start ≤ stop, got {self.start}, {self.stop}")
        if self.format not in ("raw", "chat"):
            raise ValueError(f"format: need raw or chat, got {self.format!r}")
        if self.thinking not in ("", "on", "off"):
            raise ValueError(f"thinking: need on, off or empty, got {self.thinking!r}")
        if not self.path and (
            self.fields or self.format != "raw" or self.system or self.template != "{prompt}"
        ):
            raise ValueError(
                "fields, format, template, system: only a task read from a path has them"
            )

    @property
    def is_default(self) -> bool:
        return not self.name and not self.path

    def field_map(self) -> dict[str, str]:
        if not self.fields:
            return {"prompt": "prompt", "answer": "answer"}
        return dict(pair.split("=", 1) for pair in self.fields)

    def resolve(
        self, *, n: int, seed: int, split: str = "train", checkpoint: str | Path | None = None
    ) -> ResolvedTask:
        """The task of ``n`` problems drawn with ``seed``; ``split`` is the world's split for a
        registered world (a file's split is its own ``split``); an empty spec reads the world
        of ``checkpoint``."""
        if self.path:
            return FileTask.of(self, n, seed)
        return _world(self, n=n, seed=seed, split=self.split or split, checkpoint=checkpoint)


def _world(
    spec: TaskSpec, *, n: int, seed: int, split: str, checkpoint: str | Path | None
) -> ResolvedTask:
    options: dict[str, Any] = {"split": split, "n": n, "seed": seed}
    if spec.grader:
        options["grader"] = spec.grader
    if spec.preset:
        options["preset"] = spec.preset
    if spec.name:
        return get_task(spec.name, **options)  # type: ignore[no-any-return]
    if checkpoint is None:
        raise ValueError("task: no task given and no checkpoint to read its world from")
    return checkpoint_task(checkpoint).build(**options)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FileTask:
    """A :class:`Task` on a file, with what it was resolved from (for its provenance)."""

    task: Task
    spec: TaskSpec
    n: int
    seed: int
    sha256: str

    @classmethod
    def of(cls, spec: TaskSpec, n: int, seed: int) -> FileTask:
        stop = None if spec.stop == -1 else spec.stop
        source = Source(
            spec.path,
            spec.field_map(),
            spec.kind,
            spec.split or None,
            spec.start,  # type: ignore[arg-type]
            stop,
        )
        rows = len(read_records(source))
        if rows > n:
            source = dataclasses.replace(source, sample=n, seed=seed)
        thinking = {"": None, "on": True, "off": False}[spec.thinking]
        fmt = PromptFormat(spec.format, spec.template, spec.system or None, thinking)
        grader = spec.grader or ("exact" if "answer" in source.fields else None)
        return cls(Task(source, fmt, grader), spec, n, seed, file_sha256(spec.path))

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        return self.task.problems(tokenizer)

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        return self.task.grade(problems, responses, workers)

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]:
        """Each problem's reference response (the ``response`` field), ``samples`` times."""
        if "response" not in self.task.source.fields:
            raise ValueError(
                f"fields: reference data needs a 'response' field (e.g. response=solution); "
                f"mapped: {', '.join(self.task.source.fields)}"
            )
        return [[str(p.record["response"])] * samples for p in problems]

    def describe(self) -> dict[str, Any]:
        spec = dataclasses.replace(self.spec, path=str(Path(self.spec.path).resolve()))
        return {
            "name": "file",
            "spec": dataclasses.asdict(spec),
            "n": self.n,
            "seed": self.seed,
            "sha256": self.sha256,
            "grader": self.task.grader,
        }


def file_sha256(path: str | Path) -> str:
    """sha256 (16 hex digits) of a file, or of a directory's files (names and bytes)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        try:
            h.update(f.read_bytes())
        except OSError as err:
            raise ValueError(f"path: cannot read {f} ({err.strerror})") from None
    return h.hexdigest()[:16]


def task_from_description(description: dict[str, Any]) -> ResolvedTask:
    """The task a provenance record describes (:meth:`ResolvedTask.describe`); a file whose
    bytes changed since is refused, naming it."""
    name = description.get("name")
    if name == "file":
        recorded: dict[str, Any] = dict(description["spec"])
        spec = TaskSpec(**{**recorded, "fields": tuple(recorded.get("fields", ()))})
        task = FileTask.of(spec, description["n"], description["seed"])
        if task.sha256 != description["sha256"]:
            recorded = description["sha256"]
            raise ValueError(
                f"task: {spec.path} changed since the dataset was made "
                f"(sha256 {task.sha256}, recorded {recorded})"
            )
        return task
    return rebuild_task(description)  # type: ignore[no-any-return]


# the flag of each name a task's errors start with
_FLAGS = {
    "path": "--task",
    "task": "--task",
    "fields": "--fields",
    "kind": "--kind",
    "split": "--split",
    "start": "--start",
    "stop": "--stop",
    "sample": "--n",
    "n": "--n",
    "format": "--format",
    "template": "--template",
    "system": "--system",
    "thinking": "--thinking",
    "grader": "--grader",
    "preset": "--preset",
}


@contextmanager
def task_flag_errors() -> Iterator[None]:
    """Errors of a task (``path: …``, ``fields: …``) re-raised naming the command-line flag."""
    try:
        yield
    except ValueError as err:
        head, sep, rest = str(err).partition(": ")
        if sep and head in _FLAGS:
            raise ValueError(f"{_FLAGS[head]}: {rest}") from None
        raise
