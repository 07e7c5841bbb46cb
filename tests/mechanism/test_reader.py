"""The streaming reader and validation: schema errors name file and column, batches stay
bounded, logs of another shape are refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from brisk.mechanism import (
    BlockLogError,
    BlockLogWriter,
    block_table,
    count_blocks,
    read_blocks,
    synthetic_blocks,
    validate,
)
from tests.mechanism.logs import SMALL_K, SMALL_M, SMALL_N, write_parquet

M, K, N = SMALL_M, SMALL_K, SMALL_N


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
    path = write_parquet(tmp_path / "bad.parquet", corrupt(block_table(cols, M, K)))
    with pytest.raises(BlockLogError) as err:
        validate(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: column {column!r}, every row:"), msg
    assert problem in msg


def test_expected_shape_and_empty_and_garbage(tmp_path: Path, cols: dict[str, Any]) -> None:
    good = write_parquet(tmp_path / "good.parquet", block_table(cols, M, K))
    assert validate(good, M=7, K=16) == N
    with pytest.raises(
        BlockLogError,
        match=r"good.parquet: column '\(schema metadata\)', every "
        r"row: M = 7, expected 8",
    ):
        validate(good, M=8)
    empty = write_parquet(tmp_path / "empty.parquet", block_table(cols, M, K).slice(0, 0))
    with pytest.raises(BlockLogError, match=r"empty.parquet: column '\(any\)', row 0: .*no blocks"):
        validate(empty)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(BlockLogError, match=r"junk.parquet: column '\(file\)'.*not a readable"):
        validate(junk)
    other = next(synthetic_blocks(5, 6, K, seed=1))
    mixed = write_parquet(tmp_path / "m6.parquet", block_table(other, 6, K))
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
