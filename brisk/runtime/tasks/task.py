"""A task: a source of problems, how each becomes a prompt, its reference answers, its grader.

:class:`Task` reads a user's data (:class:`~brisk.runtime.tasks.sources.Source`), formats
prompts (:class:`~brisk.runtime.tasks.formats.PromptFormat`) and names a grader
(:mod:`~brisk.runtime.tasks.graders`). What a grader receives as the answer is the record's
``answer`` field, or for the ``code`` grader the record's ``prompt``, ``test`` and
``entry_point``. Named tasks live in a registry (:func:`register_task`, :func:`get_task`), which
worlds fill (:mod:`brisk.runtime.registry`: the arithmetic world registers ``arithmetic`` and
``broad``); a training config names one with its settings (:class:`NamedTask`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from brisk.runtime.configs import Config, NoSettings, Registered, parse_config
from brisk.runtime.registry import Registry
from brisk.runtime.tasks.formats import PromptFormat
from brisk.runtime.tasks.graders import Grades, grade_all, resolve_grader
from brisk.runtime.tasks.sources import Source, read_records

__all__ = [
    "NamedTask",
    "Problem",
    "Task",
    "checkpoint_task",
    "describe_draw",
    "get_task",
    "rebuild_draw",
    "rebuild_task",
    "register_task",
    "task_names",
]


@dataclass(frozen=True)
class Problem:
    """One problem: its position in the source, the prompt text, what the grader compares
    against (None: the task has no answers) and the record it came from."""

    id: int
    prompt: str
    answer: Any
    record: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Task:
    """Problems from ``source``, prompted as ``format``, graded by ``grader`` (a built-in name
    or ``module:function``; None: no grading)."""

    source: Source
    format: PromptFormat = field(default_factory=PromptFormat)
    grader: str | None = None

    def __post_init__(self) -> None:
        if self.grader is not None:
            resolve_grader(self.grader)
            needs = ("test", "entry_point") if self.grader == "code" else ("answer",)
            absent = [role for role in needs if role not in self.source.fields]
            if absent:
                raise ValueError(
                    f"fields: the {self.grader} grader needs a {absent[0]!r} field "
                    f"(mapped: {', '.join(self.source.fields)})"
                )

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        """Every selected problem, its prompt rendered (a tokenizer is needed for chat)."""
        if tokenizer is not None:
            self.format.check(tokenizer)
        out = []
        for record in read_records(self.source):
            out.append(
                Problem(
                    record["_row"],
                    self.format.render(record, tokenizer),
                    self.answer_of(record),
                    record,
                )
            )
        return out

    def answer_of(self, record: dict[str, Any]) -> Any:
        if self.grader == "code":
            return {k: record[k] for k in ("prompt", "test", "entry_point")}
        return record.get("answer")

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        """Grade ``responses[i]`` for ``problems[i]`` (in parallel processes)."""
        if self.grader is None:
            raise ValueError("grader: this task has no grader (no reference answers)")
        return grade_all(self.grader, responses, [p.answer for p in problems], workers)


@dataclass(frozen=True)
class RegisteredTask:
    """A registered task: ``factory(**options)`` builds it (options such as ``split``, ``n``,
    ``seed``, ``grader``, ``preset`` and ``settings``, an instance of ``settings``), ``rebuild``
    makes it again from its ``describe()``."""

    factory: Callable[..., Any]
    rebuild: Callable[[dict[str, Any]], Any] | None = None
    settings: type[Config] = NoSettings
    presets: Mapping[str, Callable[[], Config]] = field(default_factory=dict)


TASKS: Registry[RegisteredTask] = Registry("task")


def register_task(
    name: str,
    factory: Callable[..., Any],
    rebuild: Callable[[dict[str, Any]], Any] | None = None,
    settings: type[Config] = NoSettings,
    presets: Mapping[str, Callable[[], Config]] | None = None,
) -> None:
    """Make ``factory(**options)`` available as the task ``name``; ``rebuild`` makes a task
    again from its ``describe()`` (what provenance records); ``settings`` is the class of what
    a training config's ``[task]`` table sets (passed to ``factory`` as ``settings=``) and
    ``presets`` named settings (``preset=``)."""
    TASKS.register(name, RegisteredTask(factory, rebuild, settings, dict(presets or {})))


def rebuild_task(description: dict[str, Any]) -> Any:
    """The registered task a ``describe()`` record names, made again from it."""
    name = description.get("name")
    rebuild = TASKS.get(str(name)).rebuild if isinstance(name, str) else None
    if rebuild is None:
        raise ValueError(f"task: cannot rebuild a task described as {name!r}")
    return rebuild(description)


_DRAW = ("split", "n", "seed", "grader")  # which problems a world's task draws, its grader
T = TypeVar("T")


def describe_draw(name: str, config: dict[str, Any], task: Any) -> dict[str, Any]:
    """A world task's ``describe()`` record: its ``name``, its settings ``config`` (as a dict)
    and its draw (``task``'s split, n, seed and grader); :func:`rebuild_draw` reads it back."""
    return {"name": name, "config": config, **{k: getattr(task, k) for k in _DRAW}}


def rebuild_draw(
    cls: Callable[..., T],
    settings: type[Config],
    description: dict[str, Any],
    extra: tuple[str, ...] = (),
) -> T:
    """The task ``cls(config, split=…, n=…, seed=…, grader=…)`` a :func:`describe_draw` record
    describes, its ``config`` parsed as ``settings`` (``extra``: more keys passed on)."""
    config = parse_config(settings, description["config"], "task.config.")
    assert isinstance(config, settings)
    return cls(config, **{k: description[k] for k in (*_DRAW, *extra)})


def task_names() -> list[str]:
    return TASKS.names()


def get_task(name: str, **options: Any) -> Any:
    """The registered task ``name`` built with ``options``."""
    return TASKS.get(name).factory(**options)


@dataclass(frozen=True)
class NamedTask(Registered):
    """A registered task by name with its settings (``[task]``: ``name = "arithmetic"`` beside
    the settings' keys, e.g. ``max_operands``)."""

    kind: ClassVar[str] = "task"

    @classmethod
    def entry(cls, name: str) -> tuple[type[Config], dict[str, Any]]:
        task = TASKS.get(name)
        return task.settings, dict(task.presets)

    def build(self, **options: Any) -> Any:
        """The task with these settings (``options``: ``split``, ``n``, ``seed``, …)."""
        return get_task(self.name, settings=self.settings, **options)


def checkpoint_task(checkpoint: str | Path) -> NamedTask:
    """The task a brisk base checkpoint was trained on: the ``[task]`` table of its
    ``train_config.json`` (without ``name``: the arithmetic world, as configs recorded it before
    names were). Errors name the file."""
    file = Path(checkpoint) / "train_config.json"
    if not file.is_file():
        raise ValueError(
            f"--task: {checkpoint} has no train_config.json (not a brisk arithmetic-world "
            "checkpoint), so the problems must be named: --task PATH or a registered name"
        )
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(config, dict) or not isinstance(config.get("task"), dict):
            raise ValueError("task: no [task] table (not a base model's training config)")
        return NamedTask.parse(config["task"], "task.", "arithmetic")
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: invalid JSON: {err.msg}") from None
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
