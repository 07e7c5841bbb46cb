"""A task: a source of problems, how each becomes a prompt, its reference answers, its grader.

:class:`Task` reads a user's data (:class:`~brisk.runtime.tasks.sources.Source`), formats
prompts (:class:`~brisk.runtime.tasks.formats.PromptFormat`) and names a grader
(:mod:`~brisk.runtime.tasks.graders`). What a grader receives as the answer is the record's
``answer`` field, or for the ``code`` grader the record's ``prompt``, ``test`` and
``entry_point``. Named tasks live in a registry (:func:`register_task`, :func:`get_task`); the
built-in arithmetic world registers itself as ``arithmetic``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from brisk.runtime.tasks.formats import PromptFormat
from brisk.runtime.tasks.graders import Grades, grade_all, resolve_grader
from brisk.runtime.tasks.sources import Source, read_records

__all__ = ["Problem", "Task", "get_task", "register_task", "task_names"]


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
            out.append(Problem(record["_row"], self.format.render(record, tokenizer),
                               self.answer_of(record), record))  # fmt: skip
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


_REGISTRY: dict[str, Callable[..., Any]] = {}
_REBUILD: dict[str, Callable[[dict[str, Any]], Any]] = {}


def register_task(
    name: str, factory: Callable[..., Any],
    rebuild: Callable[[dict[str, Any]], Any] | None = None,
) -> None:  # fmt: skip
    """Make ``factory(**options)`` available as the task ``name``; ``rebuild`` makes a task
    again from its ``describe()`` (what provenance records)."""
    _REGISTRY[name] = factory
    if rebuild is not None:
        _REBUILD[name] = rebuild


def rebuild_task(description: dict[str, Any]) -> Any:
    """The registered task a ``describe()`` record names, made again from it."""
    _load_builtin()
    name = description.get("name")
    if name not in _REBUILD:
        raise ValueError(f"task: cannot rebuild a task described as {name!r}")
    return _REBUILD[str(name)](description)


def task_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_task(name: str, **options: Any) -> Any:
    """The registered task ``name`` built with ``options``."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"task: no task {name!r} (registered: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name](**options)


def _load_builtin() -> None:
    import brisk.runtime.tiny.tasks  # noqa: F401  registers "arithmetic"
