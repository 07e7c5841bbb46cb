"""Atomic file writes: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text", "replace_dir"]


def atomic_write(target: str | os.PathLike[str], write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a temporary sibling of ``target``, then rename it into place; the
    folder is made if missing. The temporary name keeps no extension of the target's: writers
    that infer a format from the name must be told it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(target: str | os.PathLike[str], text: str) -> None:
    atomic_write(target, lambda tmp: tmp.write_text(text))


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path``, replacing what was there: a reader
    sees the old or the new directory, never half of one."""
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path
