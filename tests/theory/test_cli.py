"""`brisk theory` from the command line (bad arguments: test_cli_errors.py)."""

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


def test_figure(tmp_path: Path) -> None:
    assert main(["theory", "figure", "--stride", "8", "--out", str(tmp_path)]) == 0
    png = tmp_path / "tpf_vs_rejection_N8.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
