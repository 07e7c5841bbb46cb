"""Blocks as column arrays, both ways: the checked Arrow table the writer stores
(:func:`block_table`) and the numpy :class:`BlockBatch` every diagnostic reads
(:func:`to_numpy`). The reader and the writer share this module, so a column's layout
([n], [n, M] or [n, M, K]) is decided in one place, from the schema's column kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from brisk.mechanism.checks import check_columns
from brisk.mechanism.schema import (
    OPTIONAL_COLUMNS,
    PER_CANDIDATE_COLUMNS,
    PER_POSITION_COLUMNS,
    REQUIRED_COLUMNS,
    UNKNOWN_VERIFICATION,
    BlockLogError,
    Decoder,
    LogShape,
    Verification,
    block_schema,
)

__all__ = ["DEFAULT_BATCH_ROWS", "BlockBatch", "block_table", "to_numpy"]

DEFAULT_BATCH_ROWS = 65_536
"""Rows per batch read and per row group written."""


@dataclass(frozen=True)
class BlockBatch:
    """Numpy arrays for the ``rows`` rows ``row0 .. row0 + rows − 1`` of ``file``.

    Per-candidate columns have shape [n, M, K], per-position columns [n, M], the rest [n].
    Optional whole-block log-probabilities read as NaN where null or absent from the file; a
    version 1 file reads as ``token_offset = −1`` and ``head_block = head_choice``.
    ``verification`` is the file's (:class:`~brisk.mechanism.schema.Verification`), ``decoder``
    the family that wrote it (:data:`~brisk.mechanism.schema.Decoder`).
    """

    file: str
    row0: int
    shape: LogShape
    columns: Mapping[str, npt.NDArray[Any]]
    rows: int
    verification: Verification = UNKNOWN_VERIFICATION
    decoder: Decoder = "isd"

    @classmethod
    def from_columns(
        cls,
        columns: Mapping[str, Any],
        M: int,
        K: int,
        file: str = "<memory>",
        verification: Verification = UNKNOWN_VERIFICATION,
        decoder: Decoder = "isd",
    ) -> BlockBatch:
        """A checked in-memory batch from arrays, as :func:`block_table` takes them."""
        table = block_table(columns, M, K, file=file)
        shape = LogShape(M, K)
        cols: dict[str, npt.NDArray[Any]] = {}
        for rb in table.combine_chunks().to_batches(max_chunksize=table.num_rows + 1):
            cols = to_numpy(rb, shape)
        return cls(file, 0, shape, cols, table.num_rows, verification, decoder)

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]

    def __len__(self) -> int:
        return self.rows


def to_numpy(rb: pa.RecordBatch, shape: LogShape) -> dict[str, npt.NDArray[Any]]:
    """The columns of an Arrow record batch of the block schema, as :class:`BlockBatch` holds
    them (optional log-probabilities as float64, nulls as NaN)."""
    out: dict[str, npt.NDArray[Any]] = {}
    n = rb.num_rows
    for name, col in zip(rb.schema.names, rb.columns, strict=True):
        if name in PER_CANDIDATE_COLUMNS:
            out[name] = col.flatten().to_numpy().reshape(n, shape.M, shape.K)
        elif name in PER_POSITION_COLUMNS:
            out[name] = col.flatten().to_numpy().reshape(n, shape.M)
        elif name in OPTIONAL_COLUMNS:
            out[name] = col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        else:
            out[name] = col.to_numpy()
    return out


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

    Every column of :data:`~brisk.mechanism.schema.REQUIRED_COLUMNS` is needed; ``base_logp``
    and ``head_logp`` are optional (NaN means not scored and is stored as null).
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
        per_candidate = name in PER_CANDIDATE_COLUMNS
        width = shape.M * shape.K if per_candidate else shape.M
        target = field.type.value_type if pa.types.is_fixed_size_list(field.type) else field.type
        dtype = target.to_pandas_dtype()
        if per_candidate or name in PER_POSITION_COLUMNS:
            if raw.size != n * width:
                raise BlockLogError(file, name, None, f"expected {n} × {width} values")
            arr = raw.reshape((n, M, K) if per_candidate else (n, M))
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
