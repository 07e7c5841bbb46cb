"""Writing block logs: crash-safe Parquet parts, and the request table beside them.

The writer produces part directories (:mod:`~brisk.mechanism.discover`): each flush writes one
complete row group to a temporary hidden file, fsyncs it and renames it into place, so a crash
or ``kill -9`` of the writing process loses only rows not yet flushed, and every part a reader
sees is a whole, valid file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from brisk.mechanism.columns import DEFAULT_BATCH_ROWS, block_table
from brisk.mechanism.discover import part_path, request_path
from brisk.mechanism.requests import request_table
from brisk.mechanism.schema import (
    UNKNOWN_VERIFICATION,
    Decoder,
    LogShape,
    Verification,
    block_schema,
    decoder_metadata,
)

__all__ = ["BlockLogWriter"]


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
    ``decoder`` (:data:`~brisk.mechanism.schema.Decoder`: ``"isd"`` or ``"speculative"``), the
    family whose blocks and forwards these are, goes into every part's and request file's.
    :meth:`write_requests` adds rows of the request table
    (:mod:`brisk.mechanism.requests`), checked against that family's forwards; they reach disk
    only after every block written before them, so a request with a row never lacks a block.
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
        decoder: Decoder = "isd",
    ) -> None:
        self.path = Path(path)
        self.shape = LogShape(M, K)
        self.verification = verification
        decoder_metadata(decoder)  # refused now, not at the first flush
        self.decoder = decoder
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
        """Append blocks given as column arrays (as
        :func:`~brisk.mechanism.columns.block_table` takes them)."""
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
        if self._closed:
            raise ValueError("write_requests: the writer is closed")
        table = request_table(columns, self.shape.M, file=str(self.path), decoder=self.decoder)
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
            final = request_path(self.path, self.request_parts)
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
        schema = block_schema(self.shape.M, self.shape.K, self.verification, decoder=self.decoder)
        _write_atomic(
            part.replace_schema_metadata(schema.metadata),
            part_path(self.path, self.parts),
            compression=self.compression,
            row_group_size=rows,
        )
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
