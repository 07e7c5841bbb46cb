"""Row-level checks: every invalid value names file, column and row, whether the reader meets it
in a file or the writer before anything reaches disk."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogError, BlockLogWriter, block_table, validate
from tests.mechanism.logs import BAD_ROW, SMALL_K, SMALL_M, set_bad, write_parquet

M, K, ROW = SMALL_M, SMALL_K, BAD_ROW


def _duplicate_candidate(c: dict[str, Any]) -> None:
    c["cand_ids"] = c["cand_ids"].copy()
    c["cand_ids"][ROW, 0, 5] = c["cand_ids"][ROW, 0, 2]


VALUE_CASES = [
    pytest.param("q", set_bad("q", (2, 4), 1.5), "q outside [0, 1]", id="q-above-1"),
    pytest.param("q", set_bad("q", (0, 0), np.nan), "q outside [0, 1]", id="q-nan"),
    pytest.param("p", set_bad("p", (0, 3), -0.25), "p outside [0, 1]", id="p-negative"),
    pytest.param(
        "p", set_bad("p", (0, 1), np.nan), "NaN at a reached position", id="p-nan-reached"
    ),
    pytest.param("u", set_bad("u", (0,), np.nan), "NaN at a reached position", id="u-nan-reached"),
    pytest.param(
        "verifier_top1_prob",
        set_bad("verifier_top1_prob", (0,), np.nan),
        "NaN at a reached position",
        id="top1-prob-nan",
    ),
    pytest.param("cand_ids", _duplicate_candidate, "not unique", id="duplicate-candidates"),
    pytest.param(
        "base_choice",
        set_bad("base_choice", (3,), K),
        "outside [0, K = 16)",
        id="base-choice-K",
    ),
    pytest.param(
        "head_choice",
        set_bad("head_choice", (1,), -2),
        "outside [−1, K = 16)",
        id="head-choice-minus-2",
    ),
    pytest.param(
        "head_choice",
        set_bad("head_choice", (6,), K),
        "outside [−1, K = 16)",
        id="head-choice-K",
    ),
    pytest.param(
        "accept_len",
        set_bad("accept_len", (), M + 1),
        "outside [0, M = 7]",
        id="accept-len-above-M",
    ),
    pytest.param(
        "accept_len",
        set_bad("accept_len", (), -1),
        "outside [0, M = 7]",
        id="accept-len-negative",
    ),
    pytest.param("base_logp", set_bad("base_logp", (), 0.5), "finite and ≤ 0", id="logp-positive"),
]


@pytest.mark.parametrize(("column", "mutate", "problem"), VALUE_CASES)
def test_value_errors_name_file_column_row(
    tmp_path: Path, cols: dict[str, Any], column: str, mutate: Callable[..., None], problem: str
) -> None:
    mutate(cols)
    path = write_parquet(tmp_path / "bad.parquet", block_table(cols, M, K, check=False))
    with pytest.raises(BlockLogError) as err:
        validate(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: column {column!r}, row {ROW}:"), msg
    assert problem in msg
    assert (err.value.file, err.value.column, err.value.row) == (str(path), column, ROW)
    # the writer refuses the same rows before anything reaches disk
    with BlockLogWriter(tmp_path / "log", M, K) as writer:
        with pytest.raises(BlockLogError, match=f"column {column!r}, row {ROW}"):
            writer.write(cols)
        assert writer.rows_written == 0
    assert not list((tmp_path / "log").iterdir())


def test_cli_turns_validation_errors_into_one_line_and_exit_2(
    tmp_path: Path, cols: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    set_bad("q", (1, 1), 2.0)(cols)
    path = write_parquet(tmp_path / "bad.parquet", block_table(cols, M, K, check=False))
    for argv in (
        ["mechanism", "report", str(path), "--out", str(tmp_path / "o")],
        ["mechanism", "validate", str(path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith(f"brisk: error: {path}: column 'q', row {ROW}: q outside [0, 1]")
    assert main(["mechanism", "report", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    assert "no such block log" in capsys.readouterr().err
