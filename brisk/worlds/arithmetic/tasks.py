"""The arithmetic world as a task (registered as ``arithmetic``: ``get_task("arithmetic", ...)``):
its problems, their integer answers and the ``gsm8k`` grader, through the same interface as a
user's data."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk.runtime.tasks.graders import Grades, grade_all
from brisk.runtime.tasks.task import Problem, describe_draw, rebuild_draw
from brisk.worlds.arithmetic.task import Split, TaskConfig, make_split, sample_response, solutions

__all__ = ["PRESETS", "ArithmeticTask", "Draw"]

PRESETS = {"tiny": TaskConfig.tiny, "paper": TaskConfig.paper, "trivial": TaskConfig.trivial}


@dataclass(frozen=True)
class Draw:
    """What an arithmetic task draws from its world ``config``: ``n`` distinct problems of
    ``split`` with ``seed``, graded by ``grader``."""

    config: Any
    split: Split = "test"
    n: int = 200
    seed: int = 1
    grader: str = "gsm8k"


@dataclass(frozen=True)
class ArithmeticTask(Draw):
    """``n`` distinct problems of ``split`` drawn with ``seed`` from the world ``config``.

    >>> task = ArithmeticTask(n=2, seed=1)
    >>> [p.prompt for p in task.problems()]
    ['Q: 3+1=?\\n', 'Q: 6+8=?\\n']
    >>> task.grade(task.problems(), ["3+1=4\\n#### 4", "#### 13"]).correct
    [True, False]
    """

    config: TaskConfig = field(default_factory=TaskConfig.tiny)

    @classmethod
    def build(
        cls, preset: str = "tiny", settings: TaskConfig | None = None, **options: Any
    ) -> ArithmeticTask:
        """The task of a named world (``tiny``, ``paper``, ``trivial``), or of ``settings``."""
        if settings is not None:
            return cls(settings, **options)
        if preset not in PRESETS:
            raise ValueError(f"preset: need one of {', '.join(PRESETS)}, got {preset!r}")
        return cls(PRESETS[preset](), **options)

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        """The problems; each record also holds the canonical ``response``."""
        return [
            Problem(
                i,
                p.prompt,
                p.answer,
                {"prompt": p.prompt, "answer": p.answer, "response": p.response},
            )
            for i, p in enumerate(make_split(self.config, self.split, self.n, self.seed))
        ]

    def corpus(self, seed: int) -> Iterator[tuple[Any, str]]:
        """Endless (problem, response) pairs of the split, responses from the base corpus (what
        a base model is trained on)."""
        return solutions(self.config, self.split, seed)

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]:
        """The world's "open-source" reference corpus: ``samples`` responses per problem,
        drawn with ``random.Random(f"reference:{i}")`` (``i`` the problem's index)."""
        world = make_split(self.config, self.split, self.n, self.seed)
        out = []
        for i, _ in enumerate(problems):
            rng = random.Random(f"reference:{i}")
            out.append(
                [sample_response(world[i], self.config, rng, "reference") for _ in range(samples)]
            )
        return out

    def describe(self) -> dict[str, Any]:
        """What rebuilds this task (:meth:`from_description`): the world's settings."""
        return describe_draw("arithmetic", dataclasses.asdict(self.config), self)

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> ArithmeticTask:
        return rebuild_draw(cls, TaskConfig, description)

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        return grade_all(self.grader, responses, [p.answer for p in problems], workers)

    def export(self, path: str | Path) -> Path:
        """The problems as JSON lines ``{"prompt", "answer"}``, what a user's file looks like
        (read back with ``Source(path, {"prompt": "prompt", "answer": "answer"})``)."""
        rows = [json.dumps({"prompt": p.prompt, "answer": p.answer}) for p in self.problems()]
        atomic_write_text(Path(path), "".join(r + "\n" for r in rows))
        return Path(path)
