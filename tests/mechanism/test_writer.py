"""The writer: what it writes reads back column for column, and it refuses what it must."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from brisk.mechanism import BlockLogError, BlockLogWriter, block_schema, count_blocks, read_blocks
from tests.mechanism.logs import BAD_ROW, SMALL_K, SMALL_M, SMALL_N, set_bad

M, K, N, ROW = SMALL_M, SMALL_K, SMALL_N, BAD_ROW


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


def test_writer_errors_count_rows_from_the_start_of_the_log(
    tmp_path: Path, cols: dict[str, Any]
) -> None:
    with BlockLogWriter(tmp_path / "log", M, K) as writer:
        writer.write(cols)
        set_bad("u", (2,), 1.5)(cols)
        with pytest.raises(BlockLogError, match=f"log: column 'u', row {N + ROW}: u outside"):
            writer.write(cols)
    assert count_blocks(tmp_path / "log") == N
