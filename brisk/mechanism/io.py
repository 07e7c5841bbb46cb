"""Writing, streaming and validating block logs.

A *log* is either one Parquet file or a directory of part files ``part-NNNNNN.parquet``, or a
directory of rank folders ``rank0/``, ``rank1/``, … each of which is such a part directory (what
the SGLang server's worker writes under ``--log-blocks``: one folder per tensor-parallel rank,
only rank 0 writing today; :func:`log_folders`). The writer produces part directories: each
flush writes one complete row group to a temporary hidden file, fsyncs it and renames it into
place, so a crash or ``kill -9`` of the writing process loses only rows not yet flushed, and
every part a reader sees is a whole, valid file.

Parts carry Parquet page checksums (CRC-32 of every data page), and every reader here verifies
them, so bytes damaged on disk or in transit end as a :class:`CorruptBlockLogError` naming the
file, column and rows, not as different numbers. Files without checksums (version 1 parts, or
files written by other tools) still read; only the value checks guard them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from brisk.mechanism.checks import check_columns
from brisk.mechanism.schema import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    UNKNOWN_VERIFICATION,
    BlockLogError,
    CorruptBlockLogError,
    LogShape,
    Verification,
    block_schema,
    shape_from_schema,
    verification_of,
)

__all__ = [
    "BlockBatch",
    "BlockLogWriter",
    "block_table",
    "count_blocks",
    "log_files",
    "log_folders",
    "log_info",
    "log_shape",
    "log_verification",
    "read_blocks",
    "validate",
]

DEFAULT_BATCH_ROWS = 65_536
PART_PATTERN = "part-*.parquet"
_RANK_FOLDER = re.compile(r"rank(\d+)")
_PER_CANDIDATE = frozenset({"cand_ids", "q", "p"})
_PER_POSITION = frozenset(
    {"verifier_top1", "verifier_top1_prob", "u", "base_choice", "head_choice", "head_block"}
)


@dataclass(frozen=True)
class BlockBatch:
    """Numpy arrays for the ``rows`` rows ``row0 .. row0 + rows − 1`` of ``file``.

    Per-candidate columns have shape [n, M, K], per-position columns [n, M], the rest [n].
    Optional whole-block log-probabilities read as NaN where null or absent from the file; a
    version 1 file reads as ``token_offset = −1`` and ``head_block = head_choice``.
    ``verification`` is the file's (:class:`~brisk.mechanism.schema.Verification`).
    """

    file: str
    row0: int
    shape: LogShape
    columns: Mapping[str, npt.NDArray[Any]]
    rows: int
    verification: Verification = UNKNOWN_VERIFICATION

    @classmethod
    def from_columns(
        cls,
        columns: Mapping[str, Any],
        M: int,
        K: int,
        file: str = "<memory>",
        verification: Verification = UNKNOWN_VERIFICATION,
    ) -> BlockBatch:
        """A checked in-memory batch from arrays, as :func:`block_table` takes them."""
        table = block_table(columns, M, K, file=file)
        shape = LogShape(M, K)
        cols: dict[str, npt.NDArray[Any]] = {}
        for rb in table.combine_chunks().to_batches(max_chunksize=table.num_rows + 1):
            cols = _to_numpy(rb, shape)
        return cls(file, 0, shape, cols, table.num_rows, verification)

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]

    def __len__(self) -> int:
        return self.rows


def log_folders(path: str | os.PathLike[str]) -> list[Path]:
    """The folders that make up the log directory ``path``: ``path`` itself when it holds block
    parts (or nothing recognizable), else its rank folders ``rank<i>/`` in rank order
    (``rank2`` before ``rank10``).

    Rank folders are read together as one log: their parts must share M, K and the verification
    (:func:`log_info` names the file that differs) and their request rows must have distinct
    request ids (:func:`~brisk.mechanism.requests.read_requests` names the file). A folder that
    holds parts and rank folders both is an error naming it.
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
    found = [(int(m[1]), p) for p in path.iterdir() if p.is_dir()
             and (m := _RANK_FOLDER.fullmatch(p.name))]  # fmt: skip
    return [p for _, p in sorted(found)]


def log_files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand logs (files, part directories or directories of rank folders) into Parquet files,
    in a canonical order.

    A directory contributes its block parts, ``part-*.parquet`` (what
    :class:`BlockLogWriter` writes); other files in it are not blocks and are left alone. A
    directory without parts but with rank folders ``rank<i>/`` (:func:`log_folders`)
    contributes the parts of each, in rank order; a rank folder without parts (a rank that
    wrote no block) adds none, but at least one must hold some. A directory with neither
    parts nor rank folders is an error that names it and the Parquet files it does hold, if any.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
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


def _no_parts(path: Path, folders: list[Path]) -> str:
    if folders != [path]:
        names = ", ".join(f"{f.name}/" for f in folders)
        return f"{path}: no block-log parts (part-*.parquet) in its rank folders ({names})"
    others = sorted(p.name for p in path.glob("*.parquet") if not p.name.startswith("requests-"))
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


def _open(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file, page_checksum_verification=True)
    except (pa.ArrowInvalid, OSError) as err:
        raise BlockLogError(
            str(file), "(file)", None, f"not a readable Parquet file: {err}"
        ) from None


def log_info(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> tuple[LogShape, Verification]:
    """M, K and the verification shared by every file of the logs, from one read of each
    file's footer. Files of another M or K are an error; so are files verified differently (a
    report applies one replay rule, so greedy and sampled logs, or logs at different
    temperatures, are not pooled). The error names the file."""
    found = {}
    for f in log_files(paths):
        schema = _open(f).schema_arrow
        found[f] = (shape_from_schema(schema, str(f)), verification_of(schema, str(f)))
    first_file, (shape0, rule0) = next(iter(found.items()))
    for f, (shape, rule) in found.items():
        if shape != shape0:
            raise BlockLogError(
                str(f), "(schema metadata)", None,
                f"M = {shape.M}, K = {shape.K}, but {first_file} has M = {shape0.M}, "
                f"K = {shape0.K}",
            )  # fmt: skip
        if rule != rule0 and not (rule.rule == rule0.rule == "unknown"):
            raise BlockLogError(
                str(f), "(schema metadata)", None,
                f"verified {rule.describe()}, but {first_file} was verified {rule0.describe()}; "
                "report them separately",
            )  # fmt: skip
    return shape0, rule0


def log_shape(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> LogShape:
    """M and K shared by every file of the logs (:func:`log_info`)."""
    return log_info(paths)[0]


def log_verification(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> Verification:
    """How the logs were verified (:func:`log_info`)."""
    return log_info(paths)[1]


def count_blocks(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> int:
    """Rows in the logs, from Parquet footers only (nothing is decoded)."""
    return sum(_open(f).metadata.num_rows for f in log_files(paths))


def read_blocks(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    columns: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    *,
    check: bool = True,
    prefetch: bool = True,
) -> Iterator[BlockBatch]:
    """Stream the logs as :class:`BlockBatch` es of at most ``batch_rows`` rows.

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
    shape, verification = log_info(files)
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
            yield BlockBatch(str(file), row0, shape, {c: cols[c] for c in wanted}, n, verification)
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
            yield _to_numpy(rb, shape), rb.num_rows
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


def _to_numpy(rb: pa.RecordBatch, shape: LogShape) -> dict[str, npt.NDArray[Any]]:
    out: dict[str, npt.NDArray[Any]] = {}
    n = rb.num_rows
    for name, col in zip(rb.schema.names, rb.columns, strict=True):
        if name in _PER_CANDIDATE:
            out[name] = col.flatten().to_numpy().reshape(n, shape.M, shape.K)
        elif name in _PER_POSITION:
            out[name] = col.flatten().to_numpy().reshape(n, shape.M)
        elif name in OPTIONAL_COLUMNS:
            out[name] = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        else:
            out[name] = col.to_numpy()
    return out


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


def block_table(
    columns: Mapping[str, Any],
    M: int,
    K: int,
    *,
    check: bool = True,
    file: str = "<rows>",
    row0: int = 0,
) -> pa.Table:
    """An Arrow table of the (current version's) schema from arrays ([n], [n, M] / [n, M·K] or
    [n, M, K]).

    Every column of :data:`REQUIRED_COLUMNS` is needed; ``base_logp`` and ``head_logp`` are
    optional (NaN means not scored and is stored as null).
    With ``check`` the rows are validated first and nothing malformed gets through; errors
    number rows from ``row0``.
    """
    shape = LogShape(M, K)
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise BlockLogError(file, missing[0], None, "missing")
    schema = block_schema(M, K)
    n = len(np.asarray(columns["request_id"]))
    cols: dict[str, npt.NDArray[Any]] = {}
    for field in schema:
        name = field.name
        if name not in columns:
            cols[name] = np.full(n, np.nan)
            continue
        raw = np.asarray(columns[name])
        width = shape.M * shape.K if name in _PER_CANDIDATE else shape.M
        target = field.type.value_type if pa.types.is_fixed_size_list(field.type) else field.type
        dtype = target.to_pandas_dtype()
        if name in _PER_CANDIDATE or name in _PER_POSITION:
            if raw.size != n * width:
                raise BlockLogError(file, name, None, f"expected {n} × {width} values")
            arr = raw.reshape((n, M, K) if name in _PER_CANDIDATE else (n, M))
        else:
            if raw.shape != (n,):
                raise BlockLogError(file, name, None, f"expected shape ({n},), got {raw.shape}")
            arr = raw
        if np.issubdtype(np.dtype(dtype), np.integer) and arr.dtype.kind == "f":
            raise BlockLogError(file, name, None, f"expected integers, got {arr.dtype}")
        cols[name] = arr.astype(dtype, copy=False)
    if check:
        check_columns(cols, shape, file, row0)
    arrays: list[pa.Array] = []
    for field in schema:
        arr = cols[field.name]
        if pa.types.is_fixed_size_list(field.type):
            flat = pa.array(arr.reshape(-1), type=field.type.value_type)
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, type=field.type))
        else:
            nulls = np.isnan(arr) if field.name in OPTIONAL_COLUMNS else None
            arrays.append(pa.array(arr, type=field.type, mask=nulls))
    return pa.Table.from_arrays(arrays, schema=schema)


class BlockLogWriter:
    """Buffer blocks and write them as crash-safe Parquet parts under a directory ``path``.

    >>> import tempfile
    >>> from brisk.mechanism.synthetic import synthetic_blocks
    >>> with tempfile.TemporaryDirectory() as tmp, BlockLogWriter(f"{tmp}/log", 7, 16) as w:
    ...     for batch in synthetic_blocks(1000, seed=1):
    ...         w.write(batch)
    ...     w.rows_written
    1000

    ``write`` validates rows before buffering them (a bad row raises :class:`BlockLogError`,
    numbering rows from the start of the log, and nothing of that call is kept); a row group
    of ``rows_per_group`` rows is flushed as soon as it is full, and the rest on :meth:`flush`
    or on leaving the ``with`` block (also when it is left by an exception: the rows were
    valid). ``rows_flushed`` counts rows safely on disk.

    ``verification`` (:class:`~brisk.mechanism.schema.Verification`) goes into every part's
    metadata; it can be given later with :meth:`declare`, until the first part is written.
    :meth:`write_requests` adds rows of the request table
    (:mod:`brisk.mechanism.requests`); they reach disk only after every block written before
    them, so a request with a row never lacks a block.
    Parts are LZ4 (raw) compressed: probability lists barely compress, and LZ4 decodes about
    twice as fast as Snappy at the same size. Every data page carries a CRC-32 checksum that
    the readers verify.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        M: int,
        K: int,
        rows_per_group: int = DEFAULT_BATCH_ROWS,
        compression: str = "lz4",
        verification: Verification | None = None,
    ) -> None:
        self.path = Path(path)
        self.shape = LogShape(M, K)
        self.verification = verification
        if rows_per_group < 1:
            raise ValueError(f"rows_per_group: need a positive integer, got {rows_per_group!r}")
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise ValueError(f"{self.path}: exists and is not an empty directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self.rows_per_group = rows_per_group
        self.compression = compression
        self.rows_written = 0
        self.rows_flushed = 0
        self.parts = 0
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._requests: list[pa.Table] = []
        self._requests_buffered = 0
        self.requests_written = 0
        self.request_parts = 0
        self._closed = False

    def declare(self, verification: Verification) -> None:
        """Record how the blocks are verified; an error once a part has been written under
        another declaration (a log holds one verification)."""
        if verification != self.verification and self.parts:
            raise ValueError(
                f"verification: {self.path} already holds blocks verified "
                f"{(self.verification or UNKNOWN_VERIFICATION).describe()}"
            )
        self.verification = verification

    def __enter__(self) -> BlockLogWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def write(self, columns: Mapping[str, Any]) -> None:
        """Append blocks given as column arrays (see :func:`block_table`)."""
        if self._closed:
            raise ValueError("write: the writer is closed")
        table = block_table(
            columns, self.shape.M, self.shape.K, file=str(self.path), row0=self.rows_written
        )
        self._buffer.append(table)
        self._buffered += table.num_rows
        self.rows_written += table.num_rows
        while self._buffered >= self.rows_per_group:
            self._flush(self.rows_per_group)

    def write_block(self, **fields: Any) -> None:
        """Append one block given as keyword arguments (scalars and [M] / [M, K] arrays)."""
        self.write({k: np.asarray(v)[None] for k, v in fields.items()})

    def write_requests(self, columns: Mapping[str, Any]) -> None:
        """Append request-table rows (:func:`brisk.mechanism.requests.request_table` takes the
        same arrays), checked now, written at the next :meth:`flush`."""
        from brisk.mechanism.requests import request_table

        if self._closed:
            raise ValueError("write_requests: the writer is closed")
        table = request_table(columns, self.shape.M, file=str(self.path))
        self._requests.append(table)
        self._requests_buffered += table.num_rows
        self.requests_written += table.num_rows
        if self._requests_buffered >= self.rows_per_group:
            self.flush()

    def flush(self) -> None:
        """Write every buffered block as one more part, then the buffered request rows."""
        if self._buffered:
            self._flush(self._buffered)
        if self._requests:
            table = pa.concat_tables(self._requests).combine_chunks()
            final = self.path / f"requests-{self.request_parts:06d}.parquet"
            _write_atomic(table, final, compression=self.compression, row_group_size=table.num_rows)
            self.request_parts += 1
            self._requests, self._requests_buffered = [], 0

    def close(self) -> None:
        if not self._closed:
            self.flush()
            self._closed = True

    def _flush(self, rows: int) -> None:
        table = pa.concat_tables(self._buffer).combine_chunks()
        part, rest = table.slice(0, rows), table.slice(rows)
        schema = block_schema(self.shape.M, self.shape.K, self.verification)
        _write_atomic(part.replace_schema_metadata(schema.metadata),
                      self.path / f"part-{self.parts:06d}.parquet",
                      compression=self.compression, row_group_size=rows)  # fmt: skip
        self.parts += 1
        self.rows_flushed += rows
        self._buffer = [rest] if rest.num_rows else []
        self._buffered = rest.num_rows


def _write_atomic(table: pa.Table, final: Path, *, compression: str, row_group_size: int) -> None:
    """Write ``table`` to a hidden temporary file, fsync it and rename it to ``final``: readers
    see the whole file or none of it, and a crash leaves no half-written part."""
    tmp = final.with_name(f".{final.name}.tmp")
    # dictionary pages only slow the reader down on probability and id lists
    pq.write_table(
        table,
        tmp,
        row_group_size=row_group_size,
        compression=compression,
        use_dictionary=False,
        write_page_checksum=True,
    )
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
