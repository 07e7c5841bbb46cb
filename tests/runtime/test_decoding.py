"""``brisk.runtime.decoding``, the library under ``brisk decode``: rows in prompt order, the
partial file while decoding, an interrupted decode that keeps what finished, and the grader's
errors counted in every row and in the summary."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from brisk.runtime.decoding import decode_requests, prepare_decode, summarize
from brisk.runtime.isd import ISDOptions
from tests.runtime.graders import GRADER


def requests(n: int, grader: str | None = GRADER) -> list[dict[str, Any]]:
    """Answers 1..n, so the grader raises on ⌈n / 2⌉ of them (the odd ones)."""
    rows = [{"prompt": f"Q: {a}+1=?\n", "answer": a + 1} for a in range(n)]
    return [{**r, "grader": grader} if grader else r for r in rows]


def test_rows_in_prompt_order_with_the_grader_errors_counted(
    micro_base: Path, tmp_path: Path
) -> None:
    job = prepare_decode(micro_base, requests(7), ISDOptions(stride=4, max_new_tokens=8))
    out = tmp_path / "out.jsonl"
    decoded = decode_requests(job, out=out, batch_size=3)
    rows = decoded.rows
    assert [r["id"] for r in rows] == list(range(7))
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    assert not (tmp_path / ".out.jsonl.partial").exists()
    failed = [r["id"] for r in rows if "grader_error" in r]
    assert failed == [0, 2, 4, 6]  # answers 1, 3, 5, 7
    assert all(rows[i]["correct"] is False for i in failed)
    assert all("cannot grade answer" in rows[i]["grader_error"] for i in failed)
    assert decoded.result is not None
    figures = summarize(decoded.result, rows)
    assert (figures.graded, figures.grader_errors) == (7, 4)
    assert figures.first_grader_error == rows[0]["grader_error"]
    # negative control: the default grader (gsm8k) raises on none of the same completions
    plain = dataclasses.replace(job, requests=requests(7, grader=None))
    control = decode_requests(plain, batch_size=3)
    assert control.result is not None
    assert [r["completion"] for r in control.rows] == [r["completion"] for r in rows]
    figures = summarize(control.result, control.rows)
    assert (figures.graded, figures.grader_errors, figures.first_grader_error) == (7, 0, None)


def test_an_interrupted_decode_keeps_what_finished(micro_base: Path, tmp_path: Path) -> None:
    """KeyboardInterrupt inside the decode (what a signal raises under ``stop.abortable()``):
    no result, the finished rows in --out in prompt order, the partial file gone, the block log
    closed with at least their blocks."""
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=8)
    job = prepare_decode(micro_base, requests(8, None), options, log_blocks=tmp_path / "log")
    out, partial = tmp_path / "out.jsonl", tmp_path / ".out.jsonl.partial"
    seen: list[int] = []

    def on_row(row: dict[str, Any]) -> None:
        seen.append(row["id"])
        assert len(partial.read_text().splitlines()) == len(seen)  # appended as it finishes
        if len(seen) == 3:
            raise KeyboardInterrupt

    decoded = decode_requests(job, out=out, batch_size=2, on_row=on_row)
    assert decoded.result is None
    assert [r["id"] for r in decoded.rows] == sorted(seen)
    assert [json.loads(line) for line in out.read_text().splitlines()] == decoded.rows
    assert not partial.exists()
    assert job.logger is not None
    assert job.logger.rows_written >= sum(sum(r["accept_hist"]) for r in decoded.rows) > 0


def test_the_budget_not_given_is_fitted_to_the_model(micro_base: Path) -> None:
    """The micro base has 128 positions: 256 new tokens do not fit, so a budget not given is
    lowered to what does, and said; a budget given is refused, naming the option."""
    options = ISDOptions(stride=4)
    job = prepare_decode(micro_base, requests(2), options, budget_given=False)
    fits = [128 - len(p) - 2 * options.M for p in job.prompts]
    assert job.budgets == fits
    assert job.options.max_new_tokens == max(fits)
    assert job.options.eos_token_id == job.tokenizer.eos_token_id
    note = job.fit.note()
    assert note is not None
    assert note.startswith("2 of 2 prompts decode fewer than 256 new tokens")
    assert note.endswith("; max_new_tokens sets one budget for all)")
    with pytest.raises(ValueError, match=r"^max_new_tokens: the longest prompt"):
        prepare_decode(micro_base, requests(2), options)
