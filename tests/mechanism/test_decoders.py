"""Two decoder families in one format: a log records the family that wrote it
(``brisk.decoder``), and its request rows and TPFs are held to that family's forwards.

The speculative log, M = 3 (target forwards only: the prefill, then one verify round per block;
each block's first token_offset is prompt + 1). Request 1: rounds L = 3, 1, 0, ends at EOS:
1 + 4 + 2 + 1 = 8 tokens, 1 + 3 = 4 forwards. Request 2: rounds L = 2, 3 would commit
1 + 3 + 4 = 8 tokens, cut at the budget of 6: 3 forwards. Request 3 ends at its prefill: 1 token,
1 forward, no block. Whole run 15 / 8; complete cycles: every round, Σ(L + 1) / R = 14 / 5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from brisk.cli import main
from brisk.mechanism import (
    BlockLogError,
    BlockLogWriter,
    analyze,
    log_decoder,
    validate,
    write_report,
)
from brisk.mechanism.requests import check_requests
from brisk.mechanism.runs import COMPLETE_CYCLES, cost_model
from brisk.theory import AcceptanceProfile, CostModel
from tests.mechanism.logs import NAN, hand_block
from tests.mechanism.test_requests import write as write_isd

M = 3


def block(request: int, index: int, L: int, offset: int) -> dict[str, Any]:
    p = [[0.6, 0.2, 0.1] if i < L else [0.1, 0.6, 0.2] if i == L else [NAN] * 3 for i in range(M)]
    return hand_block(
        request, index, L, p, [0.5] * M, base=[0] * M, head=[-1] * M, token_offset=offset
    )


# token_offset: prompt + 1, then + L + 1 per round
SD_BLOCKS = [
    block(1, 0, 3, 9),
    block(1, 1, 1, 13),
    block(1, 2, 0, 15),
    block(2, 0, 2, 8),
    block(2, 1, 3, 11),
]
SD_REQUESTS: dict[str, Any] = {
    "request_id": [1, 2, 3],
    "prompt_tokens": [8, 7, 5],
    "output_tokens": [8, 6, 1],
    "forwards": [4, 3, 1],
    "verify_rounds": [3, 2, 0],
    "finished": ["eos", "length", "eos"],
}


def write_sd(
    path: Path,
    blocks: list[dict[str, Any]] = SD_BLOCKS,
    requests: dict[str, Any] | None = SD_REQUESTS,
    rows_per_group: int = 4096,
    **change: Any,
) -> Path:
    with BlockLogWriter(path, M=M, K=3, decoder="speculative", rows_per_group=rows_per_group) as w:
        for b in blocks:
            w.write_block(**b)
        if requests is not None:
            w.write_requests({k: np.asarray(change.get(k, v)) for k, v in requests.items()})
    return path


def set_meta(file: Path, key: bytes, value: bytes | None) -> None:
    """Rewrite ``file`` with metadata ``key`` set to ``value`` (None: removed)."""
    table = pq.read_table(file)
    meta = {k: v for k, v in table.schema.metadata.items() if k != key}
    if value is not None:
        meta[key] = value
    pq.write_table(table.replace_schema_metadata(meta), file)


def test_a_speculative_log_counts_every_round_as_a_cycle(tmp_path: Path) -> None:
    log = write_sd(tmp_path / "log")
    assert validate(log) == 5
    assert log_decoder(log) == "speculative"
    for f in log.iterdir():
        assert pq.read_schema(f).metadata[b"brisk.decoder"] == b"speculative", f.name
    s = analyze(log, draws=20)
    assert s.decoder == "speculative"
    assert s.run is not None
    run = s.run
    assert (run.requests, run.output_tokens, run.forwards) == (3, 15, 8)
    assert run.whole_run == 15 / 8
    assert (run.cycle_tokens, run.cycle_forwards) == (14, 5)  # Σ(L + 1), R
    assert run.complete_cycles == 14 / 5
    # every round is a complete cycle: L = 3, 1, 0, 2, 3
    assert run.cycle_profile.reached.tolist() == [5, 4, 3]
    assert run.cycle_profile.accepted.tolist() == [4, 3, 2]


def test_the_renewal_estimate_uses_the_speculative_cost_model(tmp_path: Path) -> None:
    """The run's renewal interval is brisk.theory's at the plug-in profile under g_k = k + 1,
    c_k = 1, draw for draw; its plug-in equals the complete cycles' TPF (renewal-reward), which
    ISD's cost model at the same profile would not give."""
    s = analyze(write_sd(tmp_path / "log"), draws=20)
    assert s.run is not None
    profile = AcceptanceProfile(np.array([5, 4, 3]), np.array([4, 3, 2]))
    expected = profile.tpf_interval(CostModel.speculative(M), 0.95, draws=10_000, seed=0)
    assert s.run.renewal == expected
    assert s.run.renewal.plugin == pytest.approx(14 / 5)
    assert profile.tpf(CostModel.isd(M)) != pytest.approx(14 / 5)
    assert s.tpf.plugin == pytest.approx(14 / 5)  # every logged round: the same rounds here
    assert cost_model("speculative", M) == CostModel.speculative(M)


def test_all_accepting_rounds_approach_m_plus_1(tmp_path: Path) -> None:
    """40 rounds that accept all M: complete cycles exactly M + 1, the renewal median just
    below it (the posterior keeps some mass on rejections)."""
    rounds = [block(1, k, M, 9 + (M + 1) * k) for k in range(40)]
    row = {
        "request_id": [1],
        "prompt_tokens": [8],
        "output_tokens": [1 + 40 * (M + 1)],
        "forwards": [41],
        "verify_rounds": [40],
        "finished": ["length"],
    }
    run = analyze(write_sd(tmp_path / "log", rounds, row), draws=20).run
    assert run is not None
    assert run.complete_cycles == M + 1
    assert run.renewal.plugin == M + 1
    assert M + 1 - 0.1 < run.renewal.estimate < M + 1
    assert run.renewal.low < run.renewal.estimate <= run.renewal.high <= M + 1


def test_the_lines_say_what_a_speculative_run_counts(tmp_path: Path) -> None:
    run = analyze(write_sd(tmp_path / "log"), draws=20).run
    assert run is not None
    what = {name: text for name, _, _, text in run.lines()}
    assert "every verify round" in what[COMPLETE_CYCLES]
    assert "cold start" not in " ".join(what.values())
    assert "target forwards" in str(run)
    assert "speculative" in str(run)


@pytest.mark.parametrize(
    ("change", "column", "row", "words"),
    [
        pytest.param({"forwards": [4, 4, 1]}, "forwards", 1, "per round", id="F-is-R+2"),
        pytest.param({"forwards": [4, 3, 2]}, "forwards", 2, "per round", id="cold-start"),
        pytest.param(
            {"output_tokens": [8, 10, 1]}, "output_tokens", 1, "more than", id="too-many-tokens"
        ),  # 1 + (M + 1)·2 = 9 at most
        pytest.param(
            {"output_tokens": [3, 6, 1]}, "output_tokens", 0, "fewer than", id="too-few-tokens"
        ),
    ],
)
def test_bad_speculative_rows_name_column_and_row(
    tmp_path: Path, change: dict[str, Any], column: str, row: int, words: str
) -> None:
    with pytest.raises(BlockLogError, match=words) as err:
        write_sd(tmp_path / "log", **change)
    assert (err.value.column, err.value.row) == (column, row)
    assert err.value.file == str(tmp_path / "log")


def test_a_row_is_checked_as_its_familys() -> None:
    """F = R + 2 (the prefill, the opening cold start, one round) is an ISD request and no
    speculative one; F = R + 1 (request 1 above) is a speculative request and no ISD one."""
    isd_row = {"prompt_tokens": [8], "output_tokens": [4], "forwards": [3], "verify_rounds": [1]}
    cols = {k: np.asarray(v) for k, v in isd_row.items()} | {"finished": np.array(["eos"])}
    check_requests(cols, M, "f", decoder="isd")
    with pytest.raises(BlockLogError, match="one verify forward per round") as err:
        check_requests(cols, M, "f", decoder="speculative")
    assert (err.value.column, err.value.row) == ("forwards", 0)
    sd = {k: np.asarray(v) for k, v in SD_REQUESTS.items()}
    check_requests(sd, M, "f", decoder="speculative")
    with pytest.raises(BlockLogError, match="outside") as err:
        check_requests(sd, M, "f", decoder="isd")
    assert (err.value.column, err.value.row) == ("forwards", 0)


def test_parts_of_different_decoders_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_sd(tmp_path / "log", rows_per_group=3)  # parts of 3 and 2 blocks
    second = log / "part-000001.parquet"
    set_meta(second, b"brisk.decoder", b"isd")
    with pytest.raises(BlockLogError, match="report them separately") as err:
        validate(log)
    assert err.value.file == str(second)
    assert "\n" not in str(err.value)
    assert main(["mechanism", "validate", str(log)]) == 2
    printed = capsys.readouterr().err.strip().splitlines()
    assert len(printed) == 1
    assert str(second) in printed[0]


def test_logs_of_different_decoders_are_not_pooled(tmp_path: Path) -> None:
    isd, sd = write_isd(tmp_path / "isd"), write_sd(tmp_path / "sd")
    with pytest.raises(BlockLogError, match="report them separately") as err:
        analyze([isd, sd], draws=5)
    assert err.value.file.startswith(str(sd))


def test_a_request_file_of_another_decoder_is_refused(tmp_path: Path) -> None:
    log = write_sd(tmp_path / "log")
    file = log / "requests-000000.parquet"
    set_meta(file, b"brisk.decoder", b"isd")
    with pytest.raises(BlockLogError, match="'isd', but the blocks have 'speculative'") as err:
        analyze(log, draws=5)
    assert err.value.file == str(file)
    assert "\n" not in str(err.value)


def test_an_unknown_decoder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="decoder: need one of isd, speculative"):
        BlockLogWriter(tmp_path / "log", M=M, K=3, decoder="beam")  # type: ignore[arg-type]
    assert not (tmp_path / "log").exists()
    log = write_sd(tmp_path / "sd")
    set_meta(log / "part-000000.parquet", b"brisk.decoder", b"beam")
    with pytest.raises(BlockLogError, match=r"brisk\.decoder 'beam'"):
        validate(log)


def test_files_without_the_key_read_as_isd(tmp_path: Path) -> None:
    """Every log written before the key: parts and request files without it are ISD's, with
    the TPFs they always had (tests.mechanism.test_requests)."""
    log = write_isd(tmp_path / "log")
    for f in sorted(log.iterdir()):
        assert pq.read_schema(f).metadata[b"brisk.decoder"] == b"isd", f.name
        set_meta(f, b"brisk.decoder", None)
    assert log_decoder(log) == "isd"
    s = analyze(log, draws=20)
    assert s.decoder == "isd"
    assert s.run is not None
    assert (s.run.cycle_tokens, s.run.cycle_forwards) == (15, 6)
    assert s.run.renewal.plugin == pytest.approx(2.5)


def test_the_report_records_the_decoder(tmp_path: Path) -> None:
    write_report(analyze(write_sd(tmp_path / "log"), draws=20), tmp_path / "report")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["decoder"] == "speculative"
    assert summary["tpf"]["complete_cycles"] == pytest.approx(14 / 5)
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "Decoder: speculative: the prefill and one target verify round per block" in md
    isd = analyze(write_isd(tmp_path / "isd"), draws=20)
    assert isd.to_dict()["decoder"] == "isd"


def test_the_block_logger_passes_the_decoder_through(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from brisk.runtime.isd.blocklog import BlockLogger

    with BlockLogger(tmp_path / "sd", M, 3, decoder="speculative") as logger:
        for b in SD_BLOCKS:
            logger.write_block(**b)
    assert log_decoder(tmp_path / "sd") == "speculative"
    assert BlockLogger(tmp_path / "isd", M, 3).decoder == "isd"
