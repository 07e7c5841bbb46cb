"""The held-out evaluation of a base model counts its grader's errors: a grader that raises
leaves the answer wrong and the report says how many and what the first said."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from brisk.runtime.loader import load_model
from brisk.runtime.tasks.graders import Grades, grade_all
from brisk.runtime.train.evaluate import evaluate
from tests.runtime.graders import GRADER


class GradedBy:
    """A task that grades with ``grader`` (the ``task`` of :func:`evaluate`)."""

    def __init__(self, grader: str) -> None:
        self.grader = grader

    def grade(self, problems: list[Any], responses: list[str], workers: int = 1) -> Grades:
        return grade_all(self.grader, responses, [p.answer for p in problems], workers)


def test_the_report_counts_the_graders_errors(micro_base: Path) -> None:
    loaded = load_model(micro_base, device="cpu", announce=False)
    problems = [SimpleNamespace(prompt=f"{a}+1=", answer=a + 1) for a in range(6)]
    report = evaluate(
        loaded.backbone, loaded.tokenizer, problems, strides=(), max_new=4, task=GradedBy(GRADER)
    )
    assert (report.grader_errors, report.n_problems) == (3, 6)  # answers 1, 3 and 5
    assert "cannot grade answer 1" in str(report.first_grader_error)
    assert report.to_dict()["grader_errors"] == 3
    control = evaluate(
        loaded.backbone, loaded.tokenizer, problems, strides=(), max_new=4, task=GradedBy("exact")
    )
    assert (control.grader_errors, control.first_grader_error) == (0, None)
    assert control.to_dict()["grader_errors"] == 0
