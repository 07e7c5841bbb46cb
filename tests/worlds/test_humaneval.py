"""The code world's ``humaneval`` task: HumanEval's 164 problems, graded by running them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brisk.runtime.tasks.graders import grade_all, grader_names
from brisk.runtime.tasks.task import get_task, rebuild_task
from brisk.worlds.code.humaneval import HumanEvalTask, humaneval, truncate

SAMPLE = 24  # problems whose canonical solutions are run (each is a process of ~0.1 s)


@pytest.fixture(scope="module")
def task() -> HumanEvalTask:
    return get_task("humaneval", n=SAMPLE, seed=3, split="test")  # type: ignore[no-any-return]


def test_all_164_problems_in_order_and_a_seeded_draw() -> None:
    problems = HumanEvalTask().problems()
    assert [p.record["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    assert all(set(p.answer) == {"prompt", "test", "entry_point"} for p in problems)
    drawn = [p.id for p in HumanEvalTask(n=10, seed=3).problems()]
    assert drawn == sorted(drawn) == [p.id for p in HumanEvalTask(n=10, seed=3).problems()]
    assert drawn != [p.id for p in HumanEvalTask(n=10, seed=4).problems()]


def test_canonical_solutions_pass_and_wrong_ones_fail(task: HumanEvalTask) -> None:
    problems = task.problems()
    right = task.grade(problems, [str(p.record["response"]) for p in problems], workers=2)
    assert right.correct == [True] * SAMPLE
    assert right.errors == 0
    # negative controls: no body, and a body that returns the wrong thing
    empty = task.grade(problems, [""] * SAMPLE, workers=2)
    wrong = task.grade(problems, ["    return None\n"] * SAMPLE, workers=2)
    assert empty.accuracy == 0.0
    assert wrong.accuracy == 0.0


def test_the_completion_is_cut_where_the_function_ends(task: HumanEvalTask) -> None:
    """A model that runs on past the function (a new def, a broken line, a print) passes on
    its function alone; without the cut the same text fails."""
    from brisk.runtime.tasks.code import passes

    problem = task.problems()[0]
    body = str(problem.record["response"])
    tail = "\n\ndef helper(:\n    pass\nprint(undefined_name)\n"
    assert truncate(body + tail) == body + "\n"
    assert humaneval(body + tail, problem.answer)
    assert not passes(body + tail, problem.answer)


def test_registered_by_name_and_rebuilt_from_its_description(task: HumanEvalTask) -> None:
    assert "humaneval" in grader_names()
    assert rebuild_task(task.describe()) == task
    grades = grade_all("humaneval", ["    return 0\n"], [task.problems()[0].answer], workers=1)
    assert grades.errors == 0
    with pytest.raises(ValueError, match=r"^split: HumanEval has only the test split"):
        get_task("humaneval", n=4, seed=0, split="train")
    with pytest.raises(ValueError, match=r"^task: humaneval is an evaluation"):
        task.corpus(0)


def test_brisk_decode_problems_writes_humaneval_rows(tmp_path: Path) -> None:
    """The task through the CLI: ``brisk decode problems --task humaneval`` writes rows that
    name the grader, and the rows' answers grade the canonical solutions as passing."""
    import torch

    from brisk.cli import main
    from brisk.runtime.presets import build_model
    from brisk.worlds.arithmetic.model import TinyModelConfig
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    checkpoint, out = tmp_path / "model", tmp_path / "humaneval.jsonl"
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    argv = f"decode problems --checkpoint {checkpoint} --task humaneval --n 5 --out {out}"
    assert main(argv.split()) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    assert {r["grader"] for r in rows} == {"humaneval"}
    reference = {p.id: p.record["response"] for p in HumanEvalTask().problems()}
    grades = grade_all("humaneval", [reference[r["id"]] for r in rows], [r["answer"] for r in rows])
    assert grades.correct == [True] * 5
