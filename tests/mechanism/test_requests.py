"""The request table beside the blocks: the run's TPFs by hand, and every way it can disagree
with its blocks named by file and row.

M = 3. Forwards count the prefill, which commits the first output token. Request 1: blocks
L = 3, 1, 3, 0 and it ends at its last rejection (EOS in the correction): 1 + 1 + 4 + 1 = 7
forwards (prefill, opening cold start, rounds, the cold start after L = 1),
1 + 1 + (4 + 2 + 4 + 1) + 1 = 14 tokens; complete cycles: two full rounds (4 tokens, 1 forward
each) and L = 1 closed (3 tokens, 2 forwards) → 11 / 4. Request 2: one block L = 2, closed by the
cold start that ends it: 4 forwards, 6 tokens; cycle 4 / 2. Request 3 ends at its prefill: no
block, 1 forward, 1 token. Request 4 ends at its opening cold start: no block, 2 forwards,
2 tokens. Whole run 23 / 14, complete cycles 15 / 6.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogError, BlockLogWriter, analyze
from brisk.mechanism.render import notes
from brisk.mechanism.runs import COMPLETE_CYCLES, RENEWAL, WHOLE_RUN
from tests.mechanism.logs import NAN, hand_block

P_ALL = [[0.6, 0.2, 0.1]] * 3


def block(request: int, index: int, L: int) -> dict[str, Any]:
    p = [[0.6, 0.2, 0.1] if i < L else [0.1, 0.6, 0.2] if i == L else [NAN] * 3 for i in range(3)]
    return hand_block(
        request,
        index,
        L,
        p,
        [0.5] * 3,
        base=[0, 0, 0],
        head=[-1, -1, -1],
        token_offset=10 + 5 * index,
    )


BLOCKS = [block(1, 0, 3), block(1, 1, 1), block(1, 2, 3), block(1, 3, 0), block(2, 0, 2)]
REQUESTS: dict[str, Any] = {
    "request_id": [1, 2, 3, 4],
    "prompt_tokens": [8, 8, 7, 5],  # first blocks at token_offset 10 = prompt + 2
    "output_tokens": [14, 6, 1, 2],
    "forwards": [7, 4, 1, 2],
    "verify_rounds": [4, 1, 0, 0],
    "finished": ["eos", "eos", "eos", "length"],
}


def write(path: Path, requests: dict[str, Any] | None = REQUESTS, **change: Any) -> Path:
    with BlockLogWriter(path, M=3, K=3) as writer:
        for b in BLOCKS:
            writer.write_block(**b)
        if requests is not None:
            writer.write_requests({k: np.asarray(change.get(k, v)) for k, v in requests.items()})
    return path


def test_run_tpfs_by_hand(tmp_path: Path) -> None:
    s = analyze(write(tmp_path / "log"), draws=20)
    assert s.run is not None
    run = s.run
    assert (run.requests, run.output_tokens, run.forwards) == (4, 23, 14)
    assert (run.cycle_tokens, run.cycle_forwards) == (15, 6)
    assert run.whole_run == 23 / 14
    assert run.complete_cycles == 2.5
    # the renewal interval is over the complete cycles only: L = 3, 1, 3, 2 (not the open 0)
    assert run.cycle_profile.reached.tolist() == [4, 4, 3]
    assert run.cycle_profile.accepted.tolist() == [4, 3, 2]
    assert run.renewal.low <= run.renewal.estimate <= run.renewal.high
    assert run.renewal.plugin == pytest.approx(2.5)  # the renewal-reward identity
    assert s.profile.n_blocks == 5  # the acceptance profile keeps every block


def test_the_report_names_each_tpf_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["mechanism", "report", str(write(tmp_path / "log")), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name, value in ((WHOLE_RUN, "1.643"), (COMPLETE_CYCLES, "2.500")):
        line = next(x for x in printed.splitlines() if name in x)
        assert value in line
    assert RENEWAL in printed
    assert "TPF (ISD)" not in printed
    assert "ISD at N" not in printed
    md = (out / "summary.md").read_text()
    assert f"| {WHOLE_RUN} | 23 tokens ÷ 14 forwards | 1.643 |" in md


def test_a_log_without_request_table_says_why_no_run_tpf(tmp_path: Path) -> None:
    s = analyze(write(tmp_path / "log", None), draws=20)
    assert s.run is None
    assert any("no request table" in n for n in notes(s))


def test_requests_without_a_row_are_counted_and_left_out(tmp_path: Path) -> None:
    """Request 2's row missing (unfinished when the log closed): TPFs over requests 1, 3, 4."""
    rows = {k: [v[0], v[2], v[3]] for k, v in REQUESTS.items()}
    s = analyze(write(tmp_path / "log", rows), draws=20)
    assert s.unlisted_requests == 1
    assert s.run is not None
    assert (s.run.output_tokens, s.run.forwards) == (17, 10)
    assert any("no row in the request table" in n for n in notes(s))


@pytest.mark.parametrize(
    ("change", "column", "row", "words"),
    [
        pytest.param(
            {"verify_rounds": [4, 2, 0, 0]},
            "verify_rounds",
            1,
            "holds 1 blocks",
            id="rounds-vs-blocks",
        ),
        pytest.param(
            {"forwards": [6, 4, 1, 2]}, "forwards", 0, "imply 0 cold starts", id="too-few-forwards"
        ),
        pytest.param({"forwards": [7, 4, 4, 2]}, "forwards", 2, "outside", id="forwards-range"),
        pytest.param(
            {"forwards": [7, 5, 1, 2]}, "forwards", 1, "outside", id="round-without-cold-start"
        ),  # F = R + 1: no cold start before it
        pytest.param(
            {"output_tokens": [14, 6, 0, 2]}, "output_tokens", 2, "more than", id="no-output"
        ),
        pytest.param(
            {"forwards": [7, 4, 2, 2]},
            "output_tokens",
            2,
            "fewer than its forwards",
            id="cold-start-after-the-last-token",
        ),  # n = 1 ends at the prefill
        pytest.param(
            {"forwards": [7, 4, 1, 1]},
            "output_tokens",
            3,
            "more than",
            id="prefill-commits-one-token",
        ),  # n = 2 needs the cold start
        pytest.param(
            {"finished": ["eos", "stop", "eos", "eos"]}, "finished", 1, "not one of", id="finished"
        ),
        pytest.param(
            {"request_id": [1, 1, 3, 4]}, "request_id", 1, "already has a row", id="duplicate-id"
        ),
    ],
)
def test_bad_request_rows_name_file_column_and_row(
    tmp_path: Path, change: dict[str, Any], column: str, row: int, words: str
) -> None:
    """Rows the writer can check alone are refused as they are written, the others when the
    log is read against its blocks."""
    with pytest.raises(BlockLogError, match=words) as err:
        analyze(write(tmp_path / "log", **change), draws=5)
    assert (err.value.column, err.value.row) == (column, row)
    assert err.value.file.startswith(str(tmp_path / "log"))


def test_a_rejection_must_be_closed_before_a_later_round(tmp_path: Path) -> None:
    """Request 5: L = 1 then L = 3 needs a cold start between them; 4 forwards (the prefill,
    the opening cold start and the two rounds) leave none."""
    with BlockLogWriter(tmp_path / "log", M=3, K=3) as writer:
        for b in (block(5, 0, 1), block(5, 1, 3)):
            writer.write_block(**b)
        row = {
            "request_id": [5],
            "prompt_tokens": [8],
            "output_tokens": [8],
            "forwards": [4],
            "verify_rounds": [2],
            "finished": ["eos"],
        }
        writer.write_requests(row)
    with pytest.raises(BlockLogError, match="1 rejections in the log") as err:
        analyze(tmp_path / "log", draws=5)
    assert (err.value.column, err.value.row) == ("forwards", 0)


def test_a_duplicate_across_request_files(tmp_path: Path) -> None:
    with BlockLogWriter(tmp_path / "log", M=3, K=3) as writer:
        for b in BLOCKS:
            writer.write_block(**b)
        writer.write_requests({k: np.asarray(v) for k, v in REQUESTS.items()})
        writer.flush()
        writer.write_requests({k: np.asarray(v[1:2]) for k, v in REQUESTS.items()})
    with pytest.raises(BlockLogError, match="request 2 already has a row") as err:
        analyze(tmp_path / "log", draws=5)
    assert err.value.file.endswith("requests-000001.parquet")
    assert err.value.row == 0


def test_request_rows_reach_disk_only_after_their_blocks(tmp_path: Path) -> None:
    writer = BlockLogWriter(tmp_path / "log", M=3, K=3, rows_per_group=2)
    for b in BLOCKS[:3]:
        writer.write_block(**b)  # one part of 2 blocks flushed, one block buffered
    writer.write_requests({k: np.asarray(v[:1]) for k, v in REQUESTS.items()})
    assert not list((tmp_path / "log").glob("requests-*"))
    writer.close()
    names = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert names == ["part-000000.parquet", "part-000001.parquet", "requests-000000.parquet"]


def test_validate_checks_the_request_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = write(tmp_path / "good"), write(tmp_path / "bad", verify_rounds=[4, 2, 0, 0])
    assert main(["mechanism", "validate", str(good)]) == 0
    assert "5 blocks, 4 requests" in capsys.readouterr().out
    assert main(["mechanism", "validate", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "requests-000000.parquet: column 'verify_rounds', row 1" in err[0]


def test_a_request_table_from_before_the_prefill_counted_is_refused(tmp_path: Path) -> None:
    """Rows written when forwards excluded the prefill (no ``brisk.requests_version``) mean
    other counts: read against the blocks they would give wrong TPFs, so they are refused with
    the file named and what to do."""
    log = write(tmp_path / "log")
    file = log / "requests-000000.parquet"
    table = pq.read_table(file)
    meta = {k: v for k, v in table.schema.metadata.items() if k != b"brisk.requests_version"}
    pq.write_table(table.replace_schema_metadata(meta), file)
    with pytest.raises(BlockLogError, match="requests_version absent") as err:
        analyze(log, draws=5)
    assert err.value.file == str(file)
    assert "before forwards counted the prefill" in str(err.value)
