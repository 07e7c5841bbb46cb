"""`brisk theory` from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisk.cli import main


def test_tpf_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["theory", "tpf", "--a", "0.9,0.85,0.8,0.8,0.75,0.7,0.7"]) == 0
    out = capsys.readouterr().out
    assert "M = 7 (stride N = 8)" in out
    assert "TPF = 2.9619" in out
    assert "E[L] = 3.5708" in out
    for column in ("P(L=k)", "BRISK", "D-PACE", "decay", "uniform"):
        assert column in out


def test_speculative_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["theory", "tpf", "--a", "1,1", "--cost", "sd", "--draft-cost", "0.5"]) == 0
    assert "TPF = 2.0000" in capsys.readouterr().out  # 3 tokens per 1.5 forwards


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["theory", "tpf", "--a", "0.9,1.3"], "a: probabilities must lie in [0, 1]"),
        (["theory", "tpf", "--a", "0.9", "--draft-cost", "1"], "--draft-cost"),
    ],
    ids=["out-of-range", "draft-cost-without-sd"],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("brisk: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_unparseable_profile_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["theory", "tpf", "--a", "0.9,abc"])
    assert info.value.code == 2


def test_figure(tmp_path: Path) -> None:
    assert main(["theory", "figure", "--stride", "8", "--out", str(tmp_path)]) == 0
    png = tmp_path / "tpf_vs_rejection_N8.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
