"""Bad arguments to ``brisk theory``: exit code 2 and one line on stderr naming the argument.

Every case runs :func:`brisk.cli.main` in-process; a refused command prints nothing on stdout
and writes no file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from brisk.cli import main


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], argument: str) -> str:
    """Run ``brisk argv``; check exit 2, empty stdout and one stderr line naming ``argument``."""
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1, err
    line = err.rstrip("\n")
    assert line.startswith(f"brisk: error: {argument}"), line
    return line


def tpf(*extra: str) -> list[str]:
    return ["theory", "tpf", *extra]


# -- brisk theory tpf --a


def test_a_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tpf("--a", "0.9,abc"), capsys, "--a")
    assert "'0.9,abc'" in line


def test_a_empty_entry(capsys: pytest.CaptureFixture[str]) -> None:
    assert "entry 2 is empty" in refused(tpf("--a", "0.9,,0.8"), capsys, "--a")


def test_a_trailing_comma(capsys: pytest.CaptureFixture[str]) -> None:
    assert "entry 3 is empty" in refused(tpf("--a", "0.9,0.8,"), capsys, "--a")


def test_a_no_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert "at least one" in refused(tpf("--a", ","), capsys, "--a")


def test_a_above_one(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tpf("--a", "0.9,1.3"), capsys, "--a")
    assert line.endswith("--a: need acceptance rates in [0, 1], got a_2 = 1.3")


def test_a_negative(capsys: pytest.CaptureFixture[str]) -> None:
    assert "a_1 = -0.1" in refused(tpf("--a=-0.1,0.5"), capsys, "--a")


def test_a_nan(capsys: pytest.CaptureFixture[str]) -> None:
    assert "a_2 = nan" in refused(tpf("--a", "0.9,nan"), capsys, "--a")


def test_a_missing(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf(), capsys, "the following arguments are required: --a")


# -- brisk theory tpf: cost model and baselines


def test_cost_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid choice" in refused(tpf("--a", "0.9", "--cost", "ar"), capsys, "--cost")


def test_draft_cost_without_sd(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tpf("--a", "0.9", "--draft-cost", "1"), capsys, "--draft-cost")
    assert "--cost sd" in line


def test_draft_cost_negative(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--cost", "sd", "--draft-cost=-1"), capsys, "--draft-cost")


def test_draft_cost_infinite(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--cost", "sd", "--draft-cost", "inf"), capsys, "--draft-cost")


def test_draft_cost_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--cost", "sd", "--draft-cost", "x"), capsys, "--draft-cost")


def test_gamma_zero(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--gamma", "0"), capsys, "--gamma")


def test_gamma_nan(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--gamma", "nan"), capsys, "--gamma")


def test_alpha_above_one(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--alpha", "2"), capsys, "--alpha")


def test_alpha_nan(capsys: pytest.CaptureFixture[str]) -> None:
    refused(tpf("--a", "0.9", "--alpha", "nan"), capsys, "--alpha")


# -- brisk theory figure


def test_out_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "figure.png"
    existing.write_bytes(b"keep")
    line = refused(["theory", "figure", "--out", str(existing)], capsys, "--out")
    assert str(existing) in line
    assert existing.read_bytes() == b"keep"


def test_out_parent_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "notes.txt"
    existing.write_text("keep")
    line = refused(["theory", "figure", "--out", str(existing / "figs")], capsys, "--out")
    assert str(existing) in line


def test_out_png_path_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tpf_vs_rejection_N8.png").mkdir()
    refused(["theory", "figure", "--out", str(tmp_path)], capsys, "--out")


def test_stride_below_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figs"
    refused(["theory", "figure", "--stride", "1", "--out", str(out)], capsys, "--stride")
    assert not out.exists()


def test_stride_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["theory", "figure", "--stride=-8", "--out", str(tmp_path)], capsys, "--stride")


def test_stride_too_large(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(
        ["theory", "figure", "--stride", "10000000", "--out", str(tmp_path)], capsys, "--stride"
    )


def test_stride_not_an_integer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["theory", "figure", "--stride", "8.5", "--out", str(tmp_path)], capsys, "--stride")


def test_out_missing(capsys: pytest.CaptureFixture[str]) -> None:
    refused(["theory", "figure"], capsys, "the following arguments are required: --out")
