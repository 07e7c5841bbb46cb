"""Atomic file writes: readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text", "building_dir", "disk_full", "replace_dir"]

_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
# how writers that do not raise OSError say it: torch.save's PytorchStreamWriter, safetensors'
# IoError, pyarrow's messages
_FULL_TEXT = (
    "No space left on device",
    "File too large",
    "Disk quota exceeded",
    "StorageFull",
    "FileTooLarge",
    "PytorchStreamWriter failed writing",
    "unexpected pos",
)


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


def disk_full(err: BaseException) -> str | None:
    """A one-line reason when ``err`` (or what caused it) is a write that found the disk full or
    the file-size limit reached (``ENOSPC``, ``EFBIG``, ``EDQUOT``, or a writer's own words for
    them: torch's stream writer, safetensors, pyarrow), else None."""
    seen: BaseException | None = err
    while seen is not None:
        code = getattr(seen, "errno", None)
        text = str(seen)
        if code in _FULL or any(needle in text for needle in _FULL_TEXT):
            where = getattr(seen, "filename", None)
            reason = os.strerror(code) if code in _FULL else _reason(text)
            return f"{where}: {reason}" if where else reason
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(text: str) -> str:
    for needle, reason in (
        ("No space left", "no space left on device"),
        ("StorageFull", "no space left on device"),
        ("File too large", "file too large"),
        ("FileTooLarge", "file too large"),
        ("quota", "disk quota exceeded"),
    ):
        if needle in text:
            return reason
    return "a write failed (disk full or file too large)"


@contextmanager
def building_dir(path: Path, keep: bool = False) -> Iterator[Path]:
    """A temporary sibling of the directory ``path`` (``.<name>.tmp``) to write it in: moved into
    place (:func:`replace_dir`) when the block ends, removed when it raises (a full disk, a
    signal), so the previous ``path`` stays and no half directory is left. ``keep``: the
    temporary directory already holds files of this write (FSDP shards) and is not emptied."""
    tmp = path.with_name(f".{path.name}.tmp")
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, path)


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path``, replacing what was there: a reader
    sees the old or the new directory, never half of one."""
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path
