"""Which files make up a log. A directory without parts names what it holds. Logs in rank
folders: the SGLang server's worker writes ``<log_blocks>/rank0/`` (one block-log folder per
tensor-parallel rank). The parent folder reads as the log: its rank folders' parts and request
rows, in rank order, through the API and ``brisk mechanism validate/report``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogError, BlockLogWriter, analyze, log_files, log_folders
from brisk.mechanism.requests import read_requests
from brisk.mechanism.runs import WHOLE_RUN
from tests.mechanism.test_requests import BLOCKS, REQUESTS, block, write

# request 11: one full round (L = 3) and it ends there: prefill, cold start, round = 3
# forwards; 1 + 1 + 4 = 6 tokens; one complete cycle of 4 tokens in 1 forward
RANK1_BLOCKS = [block(11, 0, 3)]
RANK1_REQUESTS: dict[str, Any] = {
    "request_id": [11],
    "prompt_tokens": [8],
    "output_tokens": [6],
    "forwards": [3],
    "verify_rounds": [1],
    "finished": ["length"],
}


def write_rank(path: Path, blocks: list[dict[str, Any]], rows: dict[str, Any], M: int = 3) -> Path:
    with BlockLogWriter(path, M=M, K=3) as writer:
        for b in blocks:
            writer.write_block(**b)
        writer.write_requests({k: np.asarray(v) for k, v in rows.items()})
    return path


def test_a_directory_without_parts_names_what_it_holds(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    with pytest.raises(ValueError, match="no block-log parts") as err:
        log_files(folder)
    assert "holds" not in str(err.value)
    write(tmp_path / "log")
    (tmp_path / "log" / "part-000000.parquet").rename(folder / "x.parquet")
    with pytest.raises(ValueError, match=r"part-\*\.parquet") as err:
        log_files(folder)
    assert "it holds x.parquet" in str(err.value)
    assert log_files(folder / "x.parquet") == [folder / "x.parquet"]


def test_a_rank0_log_reads_through_its_parent(tmp_path: Path) -> None:
    rank0 = write(tmp_path / "blocks" / "rank0")
    parent = tmp_path / "blocks"
    assert log_folders(parent) == [rank0]
    assert log_folders(rank0) == [rank0]
    assert log_files(parent) == log_files(rank0) == [rank0 / "part-000000.parquet"]
    via_parent, direct = analyze(parent, draws=20), analyze(rank0, draws=20)
    assert via_parent.run is not None
    assert via_parent.run == direct.run
    assert (via_parent.run.output_tokens, via_parent.run.forwards) == (23, 14)
    assert via_parent.n_blocks == 5
    assert via_parent.unlisted_requests == 0


def test_validate_and_report_take_the_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "blocks" / "rank0")
    parent = tmp_path / "blocks"
    assert main(["mechanism", "validate", str(parent)]) == 0
    assert f"{parent}: ok, 5 blocks, 4 requests" in capsys.readouterr().out
    out = tmp_path / "report"
    assert main(["mechanism", "report", str(parent), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "1.643" in next(x for x in printed.splitlines() if WHOLE_RUN in x)
    assert f"| {WHOLE_RUN} | 23 tokens ÷ 14 forwards | 1.643 |" in (out / "summary.md").read_text()


def test_several_ranks_are_read_in_rank_order(tmp_path: Path) -> None:
    """rank2 before rank10 (numeric order), a rank folder without parts adds nothing, and the
    requests of every rank are read; other folders (not ``rank<i>``) are left alone."""
    parent = tmp_path / "blocks"
    write(parent / "rank2")
    write_rank(parent / "rank10", RANK1_BLOCKS, RANK1_REQUESTS)
    (parent / "rank3").mkdir()  # a rank that wrote no block
    (parent / "ranking").mkdir()
    assert log_folders(parent) == [parent / "rank2", parent / "rank3", parent / "rank10"]
    assert log_files(parent) == [
        parent / "rank2" / "part-000000.parquet",
        parent / "rank10" / "part-000000.parquet",
    ]
    requests = read_requests(parent, 3)
    assert requests is not None
    assert requests.request_id.tolist() == [1, 2, 3, 4, 11]
    s = analyze(parent, draws=20)
    assert s.run is not None
    assert (s.n_blocks, s.n_requests) == (6, 3)
    assert (s.run.output_tokens, s.run.forwards) == (29, 17)
    assert (s.run.cycle_tokens, s.run.cycle_forwards) == (19, 7)


def test_ranks_that_disagree_name_the_file(tmp_path: Path) -> None:
    parent = tmp_path / "blocks"
    write(parent / "rank0")
    other = [{**b, "request_id": 11} for b in BLOCKS[:1]]
    (parent / "rank1").mkdir()
    with BlockLogWriter(parent / "rank1", M=3, K=4) as writer:  # K = 4, rank 0 has K = 3
        q, p = np.array([0.4, 0.3, 0.2, 0.1]), np.array(other[0]["p"])
        wider = {
            "cand_ids": np.arange(12).reshape(3, 4) + 10,
            "q": np.tile(q, (3, 1)),
            "p": np.pad(p, ((0, 0), (0, 1))),
        }
        writer.write_block(**(other[0] | wider))
    with pytest.raises(BlockLogError, match="K = 4, but") as err:
        analyze(parent, draws=5)
    assert err.value.file == str(parent / "rank1" / "part-000000.parquet")


def test_the_same_request_in_two_ranks_is_an_error(tmp_path: Path) -> None:
    parent = tmp_path / "blocks"
    write(parent / "rank0")
    rows = {k: v[1:2] for k, v in REQUESTS.items()}
    write_rank(parent / "rank1", [b for b in BLOCKS if b["request_id"] == 2], rows)
    with pytest.raises(BlockLogError, match="request 2 already has a row") as err:
        analyze(parent, draws=5)
    assert err.value.file == str(parent / "rank1" / "requests-000000.parquet")


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("brisk: error: ")
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


def test_a_folder_without_parts_or_ranks_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "blocks"
    empty.mkdir()
    err = refused(["mechanism", "validate", str(empty)], capsys)
    assert err == (
        f"brisk: error: {empty}: no block-log parts (part-*.parquet) and no rank folders "
        "(rank0/, …) in this directory"
    )
    (empty / "rank0").mkdir()
    (empty / "rank1").mkdir()
    err = refused(["mechanism", "report", str(empty), "--out", str(tmp_path / "r")], capsys)
    assert err == (
        f"brisk: error: {empty}: no block-log parts (part-*.parquet) in its rank folders "
        "(rank0/, rank1/)"
    )
    assert not (tmp_path / "r").exists()


def test_parts_beside_rank_folders_are_ambiguous(tmp_path: Path) -> None:
    parent = write(tmp_path / "blocks" / "rank0").parent
    shutil.copy(parent / "rank0" / "part-000000.parquet", parent / "part-000000.parquet")
    with pytest.raises(ValueError, match=r"holds block-log parts .* and rank folders \(rank0/\)"):
        log_files(parent)
    with pytest.raises(ValueError, match=str(parent)):
        read_requests(parent, 3)
