"""``brisk bench speed``: Spec-Bench's three numbers per category, against closed forms on
answer files written here, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from brisk.cli import main
from brisk.runtime.speed import read_answers, speed_report


def answers(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(i: int, tokens: int, forwards: int, wall_s: float, category: str, ids: list[int]) -> dict:
    return {
        "id": i,
        "sample": 0,
        "output_ids": ids,
        "tokens": tokens,
        "forwards": forwards,
        "wall_s": wall_s,
        "category": category,
    }


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """Plain decoding at 10 tok/s on every request; the method at 30 and 20 tok/s on code,
    15 on chat, one chat output differing in its last token."""
    base = [
        row(0, 10, 10, 1.0, "code", [1, 2, 3]),
        row(1, 20, 20, 2.0, "code", [4, 5]),
        row(2, 30, 30, 3.0, "chat", [6, 7]),
        row(3, 10, 10, 1.0, "chat", [8, 9]),
    ]
    ours = [
        row(0, 10, 4, 1 / 3, "code", [1, 2, 3]),
        row(1, 20, 8, 1.0, "code", [4, 5]),
        row(2, 30, 12, 2.0, "chat", [6, 7]),
        row(3, 10, 6, 2 / 3, "chat", [8, 0]),
    ]
    return answers(tmp_path / "ar.jsonl", base), answers(tmp_path / "sd.jsonl", ours)


def test_speedup_tau_and_equal_per_category_are_spec_benchs(files: tuple[Path, Path]) -> None:
    base, ours = files
    rows = {r.category: r for r in speed_report(base, [("sd", ours)])}
    assert list(rows) == ["chat", "code", "all"]
    code, chat, both = rows["code"], rows["chat"], rows["all"]
    # mean over requests of tokens / wall time, ratio of the means
    assert code.tokens_per_s == pytest.approx(25.0)
    assert code.baseline_tokens_per_s == pytest.approx(10.0)
    assert code.speedup == pytest.approx(2.5)
    assert chat.speedup == pytest.approx(1.5)
    assert both.speedup == pytest.approx(20.0 / 10.0)
    # tokens / target forwards over the category
    assert code.tau == pytest.approx(30 / 12)
    assert chat.tau == pytest.approx(40 / 18)
    assert both.tau == pytest.approx(70 / 30)
    assert (code.equal, chat.equal, both.equal) == (2, 1, 3)
    # the paired bootstrap's interval holds the estimate and lies within the requests' ratios
    assert code.speedup_low <= code.speedup <= code.speedup_high
    assert code.speedup_low >= 2.0
    assert code.speedup_high <= 3.0


def test_a_run_against_itself_is_one_with_no_spread(files: tuple[Path, Path]) -> None:
    base, _ = files
    for r in speed_report(base, [("plain", base)]):
        assert (r.speedup, r.speedup_low, r.speedup_high, r.tau) == (1.0, 1.0, 1.0, 1.0)
        assert r.equal == r.requests


def test_the_command_prints_and_writes_the_report(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, ours = files
    out = tmp_path / "report"
    args = ["bench", "speed", "--baseline", str(base), "--run", f"sd={ours}", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| sd | code | 2 | 25.0 | 10.0 | 2.50×" in printed
    assert "| 2/2 |" in printed
    assert "| 1/2 |" in printed
    assert (out / "speed.md").read_text() == printed
    summary = json.loads((out / "speed.json").read_text())
    assert [r["category"] for r in summary["rows"]] == ["chat", "code", "all"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(
            lambda r: r.pop("wall_s"), "line 2: no wall_s (decode one request", id="no-wall"
        ),
        pytest.param(lambda r: r.update(wall_s=0), "line 2: wall_s must be a positive", id="zero"),
        pytest.param(lambda r: r.update(id=0), "line 2: request 0 sample 0 again", id="repeat"),
        pytest.param(lambda r: r.update(id=9), "request 1 sample 0 is not in", id="other-ids"),
    ],
)
def test_bad_answer_files_are_one_line_naming_file_and_line(
    files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Any,
    message: str,
) -> None:
    base, ours = files
    rows = [json.loads(line) for line in ours.read_text().splitlines()]
    edit(rows[1])
    bad = answers(tmp_path / "bad.jsonl", rows)
    assert main(["bench", "speed", "--baseline", str(base), "--run", f"sd={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert message in err, err
    assert "--run" in err, err


def test_a_line_that_is_not_json_and_a_bad_run_flag(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, ours = files
    broken = tmp_path / "broken.jsonl"
    broken.write_text(ours.read_text() + "{oops\n")
    with pytest.raises(ValueError, match=r"broken.jsonl line 5: not JSON"):
        read_answers(broken, "--run")
    assert main(["bench", "speed", "--baseline", str(base), "--run", str(ours)]) == 2
    assert "--run: expected NAME=FILE" in capsys.readouterr().err


def test_answers_to_other_prompts_under_the_same_ids_are_refused(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    base, ours = files
    rows = [json.loads(line) for line in base.read_text().splitlines()]
    for r in rows:
        r["prompt_ids"] = [1, 2]
    same = answers(tmp_path / "same.jsonl", rows)
    rows[2]["prompt_ids"] = [1, 3]
    other = answers(tmp_path / "other.jsonl", rows)
    assert speed_report(same, [("a", ours)])  # a file without prompt ids is taken on its ids
    with pytest.raises(ValueError, match=r"--run: request 2 sample 0 has another prompt"):
        speed_report(same, [("b", other)])
