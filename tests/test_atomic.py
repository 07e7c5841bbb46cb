"""Atomic writes: the old file or the whole new one, never a part; missing folders are made."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisk._atomic import atomic_write, atomic_write_text


def test_a_write_into_a_missing_folder_makes_it(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.jsonl"
    atomic_write_text(target, "row\n")
    assert target.read_text() == "row\n"
    assert [p.name for p in target.parent.iterdir()] == ["out.jsonl"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
