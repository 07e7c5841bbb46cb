"""The generic task path against the built-in world, end to end: the arithmetic world exported to
JSON Lines (``brisk tasks export``) and read back as a user's file (file source, raw format,
``gsm8k`` grader) gives the same self-generated dataset, bit for bit, and the same evaluation
figures; and a provenance records which task a dataset was drawn from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from brisk.cli import main
from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.train.selfgen import generate_dataset, provenance_task, read_provenance
from tests.runtime.conftest import MICRO_SELFGEN


def _columns(dataset: Path) -> dict[str, list[object]]:
    parts = sorted(dataset.glob("part-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    return {
        name: [v for t in tables for v in t[name].to_pylist()] for name in tables[0].schema.names
    }


def test_selfgen_from_an_exported_file_equals_the_built_in_world(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    exported = tmp_path / "train.jsonl"
    assert (
        main(
            [
                "tasks",
                "export",
                "--checkpoint",
                str(micro_base),
                "--split",
                "train",
                "--n",
                str(MICRO_SELFGEN.problems),
                "--seed",
                str(MICRO_SELFGEN.problem_seed),
                "--out",
                str(exported),
            ]
        )
        == 0
    )
    spec = TaskSpec(path=str(exported), grader="gsm8k")
    generic = generate_dataset(
        micro_base,
        tmp_path / "generic",
        dataclasses.replace(MICRO_SELFGEN, task=spec),
        show_progress=False,
    )
    built_in, from_file = _columns(micro_dataset), _columns(generic.out)
    assert list(from_file) == list(built_in)
    for name in built_in:  # every column of every row, in order
        assert from_file[name] == built_in[name], name
    assert sum(built_in["correct"]) > 0  # the comparison grades something right and wrong
    assert not all(built_in["correct"])

    world, file_task = read_provenance(micro_dataset)["task"], read_provenance(generic.out)["task"]
    assert (world["name"], world["split"]) == ("arithmetic", "train")
    assert (file_task["name"], file_task["grader"]) == ("file", "gsm8k")
    assert file_task["spec"]["path"] == str(exported.resolve())
    assert len(file_task["sha256"]) == 16


def test_a_dataset_whose_file_changed_is_refused(micro_base: Path, tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    rows = [{"prompt": f"Q: {a}+1=?\n", "answer": a + 1} for a in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = dataclasses.replace(MICRO_SELFGEN, problems=4, chunk=4, task=TaskSpec(path=str(data)))
    out = generate_dataset(micro_base, tmp_path / "d", options, show_progress=False).out
    provenance = read_provenance(out)
    assert [p.prompt for p in provenance_task(provenance).problems()] == [r["prompt"] for r in rows]
    data.write_text(data.read_text().replace("Q: 0+1", "Q: 9+1"))
    with pytest.raises(ValueError, match=r"p\.jsonl changed since the dataset was made"):
        provenance_task(provenance)


def test_evaluation_of_the_exported_test_split_equals_the_world(
    micro_base: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.train.evaluate import evaluate

    exported = tmp_path / "test.jsonl"
    assert (
        main(
            [
                "tasks",
                "export",
                "--checkpoint",
                str(micro_base),
                "--n",
                "8",
                "--seed",
                "1",
                "--out",
                str(exported),
            ]
        )
        == 0
    )
    backbone = HFBackbone.from_pretrained(micro_base)
    tokenizer = AutoTokenizer.from_pretrained(micro_base)
    reports = []
    for spec in (
        TaskSpec(),
        TaskSpec(
            path=str(exported),
            grader="gsm8k",
            fields=("prompt=prompt", "answer=answer", "response=response"),
        ),
    ):
        task = spec.resolve(n=8, seed=1, split="test", checkpoint=micro_base)
        reports.append(
            evaluate(backbone, tokenizer, task.problems(tokenizer), strides=(2, 4), task=task)
        )
    world, generic = reports
    assert generic.to_dict() == world.to_dict()
    assert 0 < world.accuracy < 1  # a figure that distinguishes graders


def test_bad_task_input_names_the_flag_or_field(micro_base: Path, tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "Q: 1+1=?\\n", "answer": 2}\n')
    out = str(tmp_path / "o.jsonl")
    with pytest.raises(ValueError, match=r"fields: prompt = 'prompt' is not a field of .*q\.jsonl"):
        TaskSpec(path=str(data)).resolve(n=1, seed=0)
    assert (
        TaskSpec(path=str(data), fields=("prompt=question", "answer=answer"))
        .resolve(n=5, seed=0)
        .problems()[0]
        .prompt
        == "Q: 1+1=?\n"
    )  # fewer rows than asked: all of them
    with pytest.raises(ValueError, match="fields: expected role=column, got 'prompt'"):
        TaskSpec(path=str(data), fields=("prompt",))
    assert main(["tasks", "export", "--task", str(data), "--fields", "prompt", "--out", out]) == 2
    assert (
        main(
            [
                "decode",
                "problems",
                "--checkpoint",
                str(micro_base),
                "--task",
                str(tmp_path / "missing.jsonl"),
                "--out",
                out,
            ]
        )
        == 2
    )
    with pytest.raises(ValueError, match="task: no task 'gsm9k'"):
        TaskSpec(name="gsm9k").resolve(n=1, seed=0)
