"""Schema, writer, streaming reader and validation: every invalid input names file, column, row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from brisk.cli import main
from brisk.mechanism import (
    BlockLogError,
    BlockLogWriter,
    block_schema,
    block_table,
    count_blocks,
    read_blocks,
    synthetic_blocks,
    validate,
)

M, K, N = 7, 16, 40
ROW = 23  # the row every value-level case corrupts


@pytest.fixture
def cols() -> dict[str, Any]:
    return next(synthetic_blocks(N, M, K, n_requests=4, seed=11))


def _write(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def _set(name: str, index: tuple[int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(c: dict[str, Any]) -> None:
        c[name] = c[name].copy()
        c[name][(ROW, *index)] = value

    return mutate


def _duplicate_candidate(c: dict[str, Any]) -> None:
    c["cand_ids"] = c["cand_ids"].copy()
    c["cand_ids"][ROW, 0, 5] = c["cand_ids"][ROW, 0, 2]


VALUE_CASES = [
    pytest.param("q", _set("q", (2, 4), 1.5), "q outside [0, 1]", id="q-above-1"),
    pytest.param("q", _set("q", (0, 0), np.nan), "q outside [0, 1]", id="q-nan"),
    pytest.param("p", _set("p", (0, 3), -0.25), "p outside [0, 1]", id="p-negative"),
    pytest.param("p", _set("p", (0, 1), np.nan), "NaN at a reached position", id="p-nan-reached"),
    pytest.param("u", _set("u", (0,), np.nan), "NaN at a reached position", id="u-nan-reached"),
    pytest.param(
        "verifier_top1_prob",
        _set("verifier_top1_prob", (0,), np.nan),
        "NaN at a reached position",
        id="top1-prob-nan",
    ),
    pytest.param("cand_ids", _duplicate_candidate, "not unique", id="duplicate-candidates"),
    pytest.param(
        "base_choice", _set("base_choice", (3,), K), "outside [0, K = 16)", id="base-choice-K"
    ),
    pytest.param(
        "head_choice",
        _set("head_choice", (1,), -2),
        "outside [−1, K = 16)",
        id="head-choice-minus-2",
    ),
    pytest.param(
        "head_choice", _set("head_choice", (6,), K), "outside [−1, K = 16)", id="head-choice-K"
    ),
    pytest.param(
        "accept_len", _set("accept_len", (), M + 1), "outside [0, M = 7]", id="accept-len-above-M"
    ),
    pytest.param(
        "accept_len", _set("accept_len", (), -1), "outside [0, M = 7]", id="accept-len-negative"
    ),
    pytest.param("base_logp", _set("base_logp", (), 0.5), "finite and ≤ 0", id="logp-positive"),
]


@pytest.mark.parametrize(("column", "mutate", "problem"), VALUE_CASES)
def test_value_errors_name_file_column_row(
    tmp_path: Path, cols: dict[str, Any], column: str, mutate: Callable[..., None], problem: str
) -> None:
    mutate(cols)
    path = _write(tmp_path / "bad.parquet", block_table(cols, M, K, check=False))
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


def _meta(table: pa.Table, **changes: str) -> pa.Table:
    meta = dict(table.schema.metadata)
    meta.update({f"brisk.{k}".encode(): v.encode() for k, v in changes.items()})
    return table.replace_schema_metadata(meta)


SCHEMA_CASES = [
    pytest.param(lambda t: t.drop_columns(["u"]), "u", "missing", id="missing-column"),
    pytest.param(
        lambda t: _meta(t, M="6"),
        "cand_ids",
        "list size 112, but metadata says M = 6",
        id="wrong-M",
    ),
    pytest.param(lambda t: _meta(t, K="8"), "cand_ids", "K = 8", id="wrong-K"),
    pytest.param(
        lambda t: _meta(t, version="99"),
        "(schema metadata)",
        "format version 99",
        id="wrong-version",
    ),
    pytest.param(
        lambda t: t.replace_schema_metadata({}),
        "(schema metadata)",
        "brisk.version",
        id="no-metadata",
    ),
    pytest.param(
        lambda t: t.set_column(
            t.schema.get_field_index("anchor"), "anchor", t["anchor"].cast(pa.float64())
        ),
        "anchor",
        "type double, expected int32",
        id="wrong-type",
    ),
]


@pytest.mark.parametrize(("corrupt", "column", "problem"), SCHEMA_CASES)
def test_schema_errors_name_file_column(
    tmp_path: Path,
    cols: dict[str, Any],
    corrupt: Callable[[pa.Table], pa.Table],
    column: str,
    problem: str,
) -> None:
    path = _write(tmp_path / "bad.parquet", corrupt(block_table(cols, M, K)))
    with pytest.raises(BlockLogError) as err:
        validate(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: column {column!r}, every row:"), msg
    assert problem in msg


def test_expected_shape_and_empty_and_garbage(tmp_path: Path, cols: dict[str, Any]) -> None:
    good = _write(tmp_path / "good.parquet", block_table(cols, M, K))
    assert validate(good, M=7, K=16) == N
    with pytest.raises(
        BlockLogError,
        match=r"good.parquet: column '\(schema metadata\)', every "
        r"row: M = 7, expected 8",
    ):
        validate(good, M=8)
    empty = _write(tmp_path / "empty.parquet", block_table(cols, M, K).slice(0, 0))
    with pytest.raises(BlockLogError, match=r"empty.parquet: column '\(any\)', row 0: .*no blocks"):
        validate(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(BlockLogError, match=r"junk.parquet: column '\(file\)'.*not a readable"):
        validate(junk)
    other = next(synthetic_blocks(5, 6, K, seed=1))
    mixed = _write(tmp_path / "m6.parquet", block_table(other, 6, K))
    with pytest.raises(BlockLogError, match=r"m6.parquet.*M = 6, K = 16, but .*good.parquet has M"):
        list(read_blocks([good, mixed]))


def test_reader_streams_views_in_bounded_batches(tmp_path: Path) -> None:
    with BlockLogWriter(tmp_path / "log", M, K, rows_per_group=300) as writer:
        for batch in synthetic_blocks(1000, M, K, seed=2, batch_rows=128):
            writer.write(batch)
    assert writer.parts == 4
    assert count_blocks(tmp_path / "log") == 1000
    seen, starts = 0, []
    for batch in read_blocks(tmp_path / "log", columns=["q", "accept_len"], batch_rows=100):
        assert len(batch) <= 100
        assert batch["q"].shape == (len(batch), M, K)
        assert set(batch.columns) == {"q", "accept_len"}
        starts.append(batch.row0)
        seen += len(batch)
    assert seen == 1000
    expected = np.concatenate(
        [b["q"] for b in synthetic_blocks(1000, M, K, seed=2, batch_rows=128)]
    )
    got = np.concatenate([b["q"] for b in read_blocks(tmp_path / "log")])
    np.testing.assert_array_equal(got, expected)


def test_write_block_and_roundtrip_of_every_column(tmp_path: Path, cols: dict[str, Any]) -> None:
    path = tmp_path / "log"
    with BlockLogWriter(path, M, K, rows_per_group=16) as writer:
        for r in range(N):
            writer.write_block(**{k: v[r] for k, v in cols.items()})
    back = next(read_blocks(path, batch_rows=N))
    assert back.file.endswith("part-000000.parquet")
    rows = np.concatenate([b["request_id"] for b in read_blocks(path)])
    np.testing.assert_array_equal(rows, cols["request_id"])
    table = pq.read_table(path)
    assert table.schema.equals(block_schema(M, K), check_metadata=True)
    for name, want in cols.items():
        got = np.concatenate([b[name] for b in read_blocks(path)])
        np.testing.assert_array_equal(got.reshape(want.shape), want.astype(got.dtype), name)


def test_writer_refuses_a_nonempty_directory(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "x").write_text("")
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        BlockLogWriter(tmp_path / "log", M, K)


def test_cli_turns_validation_errors_into_one_line_and_exit_2(
    tmp_path: Path, cols: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    _set("q", (1, 1), 2.0)(cols)
    path = _write(tmp_path / "bad.parquet", block_table(cols, M, K, check=False))
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


def test_writer_errors_count_rows_from_the_start_of_the_log(
    tmp_path: Path, cols: dict[str, Any]
) -> None:
    with BlockLogWriter(tmp_path / "log", M, K) as writer:
        writer.write(cols)
        _set("u", (2,), 1.5)(cols)
        with pytest.raises(BlockLogError, match=f"log: column 'u', row {N + ROW}: u outside"):
            writer.write(cols)
    assert count_blocks(tmp_path / "log") == N
