"""Bad input to ``brisk mechanism``: exit code 2 and one line on stderr naming the argument or file.

Every case runs :func:`brisk.cli.main` in-process; refused commands must write nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogWriter, synthetic_blocks

M, K = 3, 4


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("errors") / "log"
    with BlockLogWriter(path, M, K) as writer:
        for batch in synthetic_blocks(200, M, K, seed=5):
            writer.write(batch)
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``brisk argv``; check exit 2, nothing on stdout and one ``brisk: error:`` line on
    stderr; return that line."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("brisk: error: ")
    assert err.count("\n") == 1, err
    assert err.endswith("\n")
    return err.rstrip("\n")


@pytest.mark.parametrize(
    ("flag", "value", "want"),
    [
        pytest.param(
            "--blocks", "0", "--blocks: need a number of blocks ≥ 1, got 0", id="blocks-0"
        ),
        pytest.param("--M", "0", "--M: need proposal positions in 1..255, got 0", id="M-0"),
        pytest.param("--K", "1", "--K: need candidates per position in 2..4096, got 1", id="K-1"),
        pytest.param("--seed", "-1", "--seed: need an integer ≥ 0, got -1", id="seed-negative"),
    ],
)
def test_synth_refuses_bad_arguments_and_writes_nothing(
    flag: str, value: str, want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "synth"
    err = refused(["mechanism", "synth", str(out), flag, value], capsys)
    assert err == f"brisk: error: {want}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "value", "want"),
    [
        pytest.param(
            "--level", "1.5", "--level: need a value strictly between 0 and 1, got 1.5", id="level"
        ),
        pytest.param(
            "--level", "0", "--level: need a value strictly between 0 and 1, got 0.0", id="level-0"
        ),
        pytest.param("--k", "99", f"--k: need values in 1..K = {K}, got 99", id="k-beyond-K"),
        pytest.param("--k", "0,2", f"--k: need values in 1..K = {K}, got 0,2", id="k-0"),
        pytest.param(
            "--bootstrap", "-1", "--bootstrap: need a number of draws ≥ 0, got -1", id="bootstrap"
        ),
        pytest.param("--seed", "-3", "--seed: need an integer ≥ 0, got -3", id="seed-negative"),
    ],
)
def test_report_refuses_bad_arguments_before_reading(
    flag: str,
    value: str,
    want: str,
    log: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "report"
    err = refused(["mechanism", "report", str(log), "--out", str(out), flag, value], capsys)
    assert err == f"brisk: error: {want}"
    assert not out.exists()


@pytest.mark.parametrize("under", [False, True], ids=["out-is-a-file", "out-under-a-file"])
def test_report_refuses_an_out_that_is_a_file(
    under: bool, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "summary.txt"
    file.write_text("keep me\n")
    out = file / "report" if under else file
    err = refused(["mechanism", "report", str(log), "--out", str(out)], capsys)
    assert err == f"brisk: error: --out: need a directory, got the file {file}"
    assert file.read_text() == "keep me\n"


@pytest.mark.parametrize("command", ["report", "validate"])
def test_missing_log_is_named(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-log"
    extra = ["--out", str(tmp_path / "report")] if command == "report" else []
    err = refused(["mechanism", command, str(missing), *extra], capsys)
    assert err == f"brisk: error: {missing}: no such block log"
    assert not (tmp_path / "report").exists()


def flip_inside_data_page(part: Path, column: str) -> None:
    """Invert one byte in the middle of ``column``'s (single) compressed data page of row
    group 0, past the page header."""
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 1
    group = meta.row_group(0)
    (chunk,) = [
        group.column(i)
        for i in range(group.num_columns)
        if group.column(i).path_in_schema.split(".")[0] == column
    ]
    # the writer's settings: LZ4, page checksums, no dictionary page; a chunk of a few KB is
    # one data page, so its middle lies in the page's payload, not in the page header
    assert chunk.compression == "LZ4"
    assert chunk.dictionary_page_offset is None
    assert 1_000 < chunk.total_compressed_size < 100_000
    at = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(part.read_bytes())
    data[at] ^= 0xFF
    part.write_bytes(bytes(data))


@pytest.mark.parametrize("command", ["report", "validate"])
def test_flipped_bytes_in_a_data_page_fail_the_page_checksum(
    command: str, log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(log, damaged)
    (part,) = sorted(damaged.glob("part-*.parquet"))
    flip_inside_data_page(part, "q")
    out = tmp_path / "report"
    extra = ["--out", str(out)] if command == "report" else []
    err = refused(["mechanism", command, str(damaged), *extra], capsys)
    assert err == (
        f"brisk: error: {part}: corrupt Parquet data (page checksum mismatch) in column 'q', "
        "rows 0–199 (row group 0)"
    )
    assert not out.exists()
