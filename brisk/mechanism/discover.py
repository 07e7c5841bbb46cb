"""Which files make up a block log.

A *log* is either one Parquet file or a directory of part files ``part-NNNNNN.parquet``, or a
directory of rank folders ``rank0/``, ``rank1/``, … each of which is such a part directory (what
the SGLang server's worker writes under ``--log-blocks``: one folder per tensor-parallel rank,
only rank 0 writing today; :func:`log_folders`). Beside the parts, a part directory may hold the
request table's files ``requests-NNNNNN.parquet`` (:mod:`brisk.mechanism.requests`).

Only this module knows that layout: the reader, the writer and the request table ask it for
paths, and it reads no file's contents.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "PART_PATTERN",
    "REQUEST_PATTERN",
    "log_files",
    "log_folders",
    "part_path",
    "request_files",
    "request_path",
]

PART_PATTERN = "part-*.parquet"
REQUEST_PATTERN = "requests-*.parquet"
_RANK_FOLDER = re.compile(r"rank(\d+)")

Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def part_path(folder: Path, index: int) -> Path:
    """Where the writer puts block part ``index`` of a part directory."""
    return folder / f"part-{index:06d}.parquet"


def request_path(folder: Path, index: int) -> Path:
    """Where the writer puts request file ``index`` of a part directory."""
    return folder / f"requests-{index:06d}.parquet"


def _as_list(paths: Paths) -> list[Path]:
    if isinstance(paths, str | os.PathLike):
        return [Path(paths)]
    return [Path(p) for p in paths]


def log_folders(path: str | os.PathLike[str]) -> list[Path]:
    """The folders that make up the log directory ``path``: ``path`` itself when it holds block
    parts (or nothing recognizable), else its rank folders ``rank<i>/`` in rank order
    (``rank2`` before ``rank10``).

    Rank folders are read together as one log: their parts must share M, K and the verification
    (:func:`~brisk.mechanism.reader.log_info` names the file that differs) and their request rows
    must have distinct request ids (:func:`~brisk.mechanism.requests.read_requests` names the
    file). A folder that holds parts and rank folders both is an error naming it.
    """
    path = Path(path)
    ranks = _rank_folders(path)
    if not ranks:
        return [path]
    if any(path.glob(PART_PATTERN)):
        names = ", ".join(f"{r.name}/" for r in ranks)
        raise ValueError(
            f"{path}: holds block-log parts (part-*.parquet) and rank folders ({names}) both; "
            "pass one rank folder, or move the parts into their own"
        )
    return ranks


def _rank_folders(path: Path) -> list[Path]:
    found = []
    for p in path.iterdir():
        if p.is_dir() and (m := _RANK_FOLDER.fullmatch(p.name)):
            found.append((int(m[1]), p))
    return [p for _, p in sorted(found)]


def log_files(paths: Paths) -> list[Path]:
    """Expand logs (files, part directories or directories of rank folders) into Parquet files,
    in a canonical order.

    A directory contributes its block parts, ``part-*.parquet`` (what
    :class:`~brisk.mechanism.writer.BlockLogWriter` writes); other files in it are not blocks and
    are left alone. A directory without parts but with rank folders ``rank<i>/``
    (:func:`log_folders`) contributes the parts of each, in rank order; a rank folder without
    parts (a rank that wrote no block) adds none, but at least one must hold some. A directory
    with neither parts nor rank folders is an error that names it and the Parquet files it does
    hold, if any.
    """
    files: list[Path] = []
    for path in _as_list(paths):
        if path.is_dir():
            folders = log_folders(path)
            parts = [f for folder in folders for f in sorted(folder.glob(PART_PATTERN))]
            if not parts:
                raise ValueError(_no_parts(path, folders))
            files.extend(parts)
        elif path.exists():
            files.append(path)
        else:
            raise ValueError(f"{path}: no such block log")
    if not files:
        raise ValueError("no block log given")
    return files


def request_files(paths: Paths) -> list[Path]:
    """The request files of the logs' directories, those of each rank folder in rank order for a
    directory of rank folders (:func:`log_folders`); a log given as a file has none."""
    return [
        f
        for p in _as_list(paths)
        if p.is_dir()
        for folder in log_folders(p)
        for f in sorted(folder.glob(REQUEST_PATTERN))
    ]


def _no_parts(path: Path, folders: list[Path]) -> str:
    if folders != [path]:
        names = ", ".join(f"{f.name}/" for f in folders)
        return f"{path}: no block-log parts (part-*.parquet) in its rank folders ({names})"
    others = sorted(p.name for p in path.glob("*.parquet") if not p.match(REQUEST_PATTERN))
    if not others:
        return (
            f"{path}: no block-log parts (part-*.parquet) and no rank folders (rank0/, …) in "
            "this directory"
        )
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (
        f"{path}: no block-log parts (part-*.parquet) in this directory; it holds {shown}: "
        "pass such a file by its own path to read it as a block log"
    )
