"""Streaming and validating block logs (the files :mod:`~brisk.mechanism.discover` finds).

Parts carry Parquet page checksums (CRC-32 of every data page), and every reader here verifies
them, so bytes damaged on disk or in transit end as a :class:`CorruptBlockLogError` naming the
file, column and rows, not as different numbers. Files without checksums (version 1 parts, or
files written by other tools) still read; only the value checks guard them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from brisk.mechanism.checks import check_columns
from brisk.mechanism.columns import DEFAULT_BATCH_ROWS, BlockBatch, to_numpy
from brisk.mechanism.discover import Paths, log_files
from brisk.mechanism.schema import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    BlockLogError,
    CorruptBlockLogError,
    Decoder,
    LogShape,
    Verification,
    decoder_of,
    shape_from_schema,
    verification_of,
)

__all__ = [
    "count_blocks",
    "log_decoder",
    "log_info",
    "log_shape",
    "log_verification",
    "read_blocks",
    "validate",
]


def _open(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as err:
        raise BlockLogError(
            str(file), "(file)", None, f"not a readable Parquet file: {err}"
        ) from None


def log_info(paths: Paths) -> tuple[LogShape, Verification, Decoder]:
    """M, K, the verification and the decoder family shared by every file of the logs, from
    one read of each file's footer. Files of another M or K are an error; so are files verified
    differently (a report applies one replay rule, so greedy and sampled logs, or logs at
    different temperatures, are not pooled), and files of another decoder family (whose
    forwards count differently). The error names the file."""
    found = {}
    for f in log_files(paths):
        schema = _open(f).schema_arrow
        found[f] = (
            shape_from_schema(schema, str(f)),
            verification_of(schema, str(f)),
            decoder_of(schema, str(f)),
        )
    first_file, (shape0, rule0, decoder0) = next(iter(found.items()))
    for f, (shape, rule, decoder) in found.items():
        if shape != shape0:
            problem = (
                f"M = {shape.M}, K = {shape.K}, but {first_file} has M = {shape0.M}, K = {shape0.K}"
            )
            raise BlockLogError(str(f), "(schema metadata)", None, problem)
        if rule != rule0 and not (rule.rule == rule0.rule == "unknown"):
            problem = (
                f"verified {rule.describe()}, but {first_file} was verified {rule0.describe()}; "
                "report them separately"
            )
            raise BlockLogError(str(f), "(schema metadata)", None, problem)
        if decoder != decoder0:
            problem = (
                f"brisk.decoder {decoder!r}, but {first_file} has {decoder0!r} (their forwards "
                "count differently); report them separately"
            )
            raise BlockLogError(str(f), "(schema metadata)", None, problem)
    return shape0, rule0, decoder0


def log_shape(paths: Paths) -> LogShape:
    """M and K shared by every file of the logs (:func:`log_info`)."""
    return log_info(paths)[0]


def log_verification(paths: Paths) -> Verification:
    """How the logs were verified (:func:`log_info`)."""
    return log_info(paths)[1]


def log_decoder(paths: Paths) -> Decoder:
    """The decoder family that wrote the logs (:func:`log_info`)."""
    return log_info(paths)[2]


def count_blocks(paths: Paths) -> int:
    """Rows in the logs, from Parquet footers only (nothing is decoded)."""
    return sum(_open(f).metadata.num_rows for f in log_files(paths))


def read_blocks(
    paths: Paths,
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    *,
    check: bool = True,
    prefetch: bool = True,
) -> Iterator[BlockBatch]:
    """Stream the logs as :class:`~brisk.mechanism.columns.BlockBatch` es of at most
    ``batch_rows`` rows.

    Memory is bounded by two batches (and a row group of the file being read), never by
    the file. With ``check`` every batch passes :func:`~brisk.mechanism.checks.check_columns`
    (``accept_len`` is then read as well, since reachability decides what NaN means). With
    ``prefetch`` the next batch is read in a background thread.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows: need a positive integer, got {batch_rows!r}")
    batches = _read(log_files(paths), columns, batch_rows, check)  # paths may be a generator
    if not prefetch:
        yield from batches
        return
    # decode and check batch b + 1 in a worker thread while the caller works on batch b
    # (pyarrow and numpy release the GIL): two batches in memory at most
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(next, batches, None)
        while (batch := pending.result()) is not None:
            pending = pool.submit(next, batches, None)
            yield batch


def _read(
    files: list[Path], columns: Sequence[str] | None, batch_rows: int, check: bool
) -> Iterator[BlockBatch]:
    shape, verification, decoder = log_info(files)
    wanted = list(REQUIRED_COLUMNS + OPTIONAL_COLUMNS) if columns is None else list(columns)
    unknown = set(wanted) - set(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)
    if unknown:
        raise ValueError(f"columns: unknown {sorted(unknown)}")
    for file in files:
        pf = _open(file)
        present = set(pf.schema_arrow.names)
        read = [c for c in wanted if c in present]
        if "head_block" in wanted and "head_block" not in present and "head_choice" not in read:
            read.append("head_choice")  # version 1: the head's block is what head_choice held
        if check and "accept_len" not in read:
            read.append("accept_len")
        row0 = 0
        for cols, n in _decode(pf, str(file), read, batch_rows, shape):
            if check:  # before filling in: version 1 files are checked as version 1
                check_columns(cols, shape, str(file), row0)
            for name in wanted:
                if name not in cols:
                    cols[name] = _absent(name, cols, n)
            yield BlockBatch(
                str(file), row0, shape, {c: cols[c] for c in wanted}, n, verification, decoder
            )
            row0 += n


def _absent(name: str, cols: Mapping[str, npt.NDArray[Any]], n: int) -> npt.NDArray[Any]:
    """A column the file lacks: optional log-probabilities (NaN) or a version 2 column."""
    if name == "token_offset":
        return np.full(n, -1, dtype=np.int64)
    if name == "head_block":
        return cols["head_choice"]
    return np.full(n, np.nan)


def _decode(
    pf: pq.ParquetFile, file: str, columns: list[str], batch_rows: int, shape: LogShape
) -> Iterator[tuple[dict[str, npt.NDArray[Any]], int]]:
    """Batches of ``columns`` as numpy, row group by row group; damaged pages raise
    :class:`CorruptBlockLogError` naming the row group's rows and the column."""
    row0 = 0
    for g in range(pf.num_row_groups):
        batches = pf.iter_batches(
            batch_size=batch_rows, row_groups=[g], columns=columns, use_threads=True
        )
        while True:
            try:
                rb = next(batches)
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as err:
                raise _corrupt(pf, file, columns, g, row0, err) from None
            yield to_numpy(rb, shape), rb.num_rows
        row0 += pf.metadata.row_group(g).num_rows


def _corrupt(
    pf: pq.ParquetFile, file: str, columns: list[str], group: int, row0: int, err: Exception
) -> CorruptBlockLogError:
    column = "(unknown)"
    for name in columns:  # the failing column, read alone (only on this error path)
        try:
            pf.read_row_group(group, columns=[name])
        except (OSError, pa.ArrowException):
            column = name
            break
    text = " ".join(str(err).split())  # one line on the command line
    detail = "page checksum mismatch" if "checksum" in text.lower() else f"undecodable: {text}"
    rows = pf.metadata.row_group(group).num_rows
    return CorruptBlockLogError(file, column, group, row0, rows, detail)


def validate(path: str | os.PathLike[str], M: int | None = None, K: int | None = None) -> int:
    """Check one log end to end; return its number of blocks.

    Raises :class:`BlockLogError` naming the file, column and row for: a missing column, a wrong
    type, M, K or format version, q or p outside [0, 1], NaN at a reached position, candidate
    ids repeated within a position, a choice index outside its range, a ``head_block`` that is
    −1 at some positions only, accept_len outside [0, M], a token_offset below 1 or below an
    earlier block's of the same request (among the rows of one batch), or an empty log; and
    :class:`CorruptBlockLogError` for a data page that fails its checksum or cannot be decoded.
    """
    shape = log_shape(path)
    for name, want, got in (("M", M, shape.M), ("K", K, shape.K)):
        if want is not None and want != got:
            file = str(log_files(path)[0])
            raise BlockLogError(file, "(schema metadata)", None, f"{name} = {got}, expected {want}")
    rows = 0
    for batch in read_blocks(path):
        rows += len(batch)
    if rows == 0:
        raise BlockLogError(str(log_files(path)[0]), "(any)", 0, "the log has no blocks")
    return rows
