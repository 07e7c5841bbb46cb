"""The block-log schema: one Parquet row per proposal block (DESIGN.md, "mechanism — the contract").

Columns (B blocks, M proposal positions, K candidates per position; lists are fixed-size and
flattened position-major, so entry ``i·K + k`` is candidate k of position i + 1):

=====================  ==================  ====================================================
column                 type                meaning
=====================  ==================  ====================================================
``request_id``         int64               request the block belongs to
``block_index``        int64               index of the block within its request
``anchor``             int32               x_0, the committed token just before the block
``cand_ids``           int32 [M·K]         C_i, the Top-K token ids of q_i, by q descending
``q``                  float32 [M·K]       base proposal q_i(C_i[k]) (full-vocab normalized)
``p``                  float32 [M·K]       verifier p_i(C_i[k]) under the factual prefix;
                                           NaN where not computed (positions not reached)
``verifier_top1``      int32 [M]           argmax of p_i over the full vocabulary (−1: unreached)
``verifier_top1_prob`` float32 [M]         p_i(verifier_top1) (NaN: unreached)
``u``                  float64 [M]         acceptance draw u_i (NaN allowed where unreached)
``base_choice``        int16 [M]           rank into C_i the base selector took
``head_choice``        int16 [M]           rank into C_i the corrector took; −1: head not run
``accept_len``         int16               L, accepted-prefix length, 0..M
``base_logp``          float64, nullable   whole-block L(b_base | c) (eq. 9), optional
``head_logp``          float64, nullable   whole-block L(b_head | c) (eq. 9), optional
=====================  ==================  ====================================================

Position i (1-based) is *reached* when i ≤ min(L + 1, M); the reached positions are the
verified ones, and the *first breaker* is position L + 1 when L < M. M, K and the format version
live in the schema metadata under ``brisk.M``, ``brisk.K`` and ``brisk.version``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = [
    "FORMAT_VERSION",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "BlockLogError",
    "LogShape",
    "block_schema",
]

FORMAT_VERSION = 1

_META_M, _META_K, _META_VERSION = b"brisk.M", b"brisk.K", b"brisk.version"

# (name, element type, list length: "MK", "M" or None for a scalar column)
_COLUMNS: tuple[tuple[str, pa.DataType, str | None], ...] = (
    ("request_id", pa.int64(), None),
    ("block_index", pa.int64(), None),
    ("anchor", pa.int32(), None),
    ("cand_ids", pa.int32(), "MK"),
    ("q", pa.float32(), "MK"),
    ("p", pa.float32(), "MK"),
    ("verifier_top1", pa.int32(), "M"),
    ("verifier_top1_prob", pa.float32(), "M"),
    ("u", pa.float64(), "M"),
    ("base_choice", pa.int16(), "M"),
    ("head_choice", pa.int16(), "M"),
    ("accept_len", pa.int16(), None),
)
_OPTIONAL: tuple[tuple[str, pa.DataType], ...] = (
    ("base_logp", pa.float64()),
    ("head_logp", pa.float64()),
)

REQUIRED_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in _COLUMNS)
OPTIONAL_COLUMNS: tuple[str, ...] = tuple(name for name, _ in _OPTIONAL)


class BlockLogError(ValueError):
    """A block log that breaks the schema; the message names the file, column and row.

    ``row`` is the 0-based row within the file (``None`` when the problem is the whole column
    or the file's metadata).
    """

    def __init__(self, file: str, column: str, row: int | None, problem: str) -> None:
        self.file, self.column, self.row, self.problem = file, column, row, problem
        where = "every row" if row is None else f"row {row}"
        super().__init__(f"{file}: column {column!r}, {where}: {problem}")


@dataclass(frozen=True)
class LogShape:
    """M proposal positions and K candidates per position, as stored in a log's metadata."""

    M: int
    K: int

    def __post_init__(self) -> None:
        if not (isinstance(self.M, int) and 1 <= self.M <= 255):
            raise ValueError(f"M: need an integer in [1, 255], got {self.M!r}")
        if not (isinstance(self.K, int) and 1 <= self.K <= 4096):
            raise ValueError(f"K: need an integer in [1, 4096], got {self.K!r}")

    def width(self, kind: str | None) -> int | None:
        """List length of a column kind ("MK", "M" or scalar ``None``)."""
        return {"MK": self.M * self.K, "M": self.M, None: None}[kind]


def block_schema(M: int, K: int, *, logp: bool = True) -> pa.Schema:
    """The Arrow schema of a block log with M positions and K candidates.

    >>> s = block_schema(7, 16)
    >>> s.field("q").type
    FixedSizeListType(fixed_size_list<element: float not null>[112])
    >>> s.metadata[b"brisk.M"], s.metadata[b"brisk.K"]
    (b'7', b'16')
    """
    shape = LogShape(M, K)
    fields = []
    for name, dtype, kind in _COLUMNS:
        width = shape.width(kind)
        typ = (
            dtype if width is None else pa.list_(pa.field("element", dtype, nullable=False), width)
        )
        fields.append(pa.field(name, typ, nullable=False))
    if logp:
        fields.extend(pa.field(name, dtype, nullable=True) for name, dtype in _OPTIONAL)
    meta = {_META_M: str(M).encode(), _META_K: str(K).encode()}
    meta[_META_VERSION] = str(FORMAT_VERSION).encode()
    return pa.schema(fields, metadata=meta)


def shape_from_schema(schema: pa.Schema, file: str) -> LogShape:
    """Read and check M, K, version and column types; raise :class:`BlockLogError` if off."""
    meta = schema.metadata or {}
    values: dict[bytes, int] = {}
    for key in (_META_VERSION, _META_M, _META_K):
        raw = meta.get(key)
        try:
            values[key] = int(raw) if raw is not None else -1
        except ValueError:
            values[key] = -1
        if values[key] < 0:
            raise BlockLogError(
                file, "(schema metadata)", None, f"missing or unreadable {key.decode()!r}"
            )
    if values[_META_VERSION] != FORMAT_VERSION:
        raise BlockLogError(
            file,
            "(schema metadata)",
            None,
            f"format version {values[_META_VERSION]}, this brisk reads version {FORMAT_VERSION}",
        )
    try:
        shape = LogShape(values[_META_M], values[_META_K])
    except ValueError as err:
        raise BlockLogError(file, "(schema metadata)", None, str(err)) from None
    for name, dtype, kind in _COLUMNS:
        if schema.get_field_index(name) < 0:
            raise BlockLogError(file, name, None, "missing")
        _check_type(file, name, schema.field(name).type, dtype, shape.width(kind), shape)
    for name, dtype in _OPTIONAL:
        if schema.get_field_index(name) >= 0:
            _check_type(file, name, schema.field(name).type, dtype, None, shape)
    return shape


def _check_type(
    file: str, name: str, got: pa.DataType, dtype: pa.DataType, width: int | None, shape: LogShape
) -> None:
    if width is None:
        if got != dtype:
            raise BlockLogError(file, name, None, f"type {got}, expected {dtype}")
        return
    if not pa.types.is_fixed_size_list(got) or got.value_type != dtype:
        raise BlockLogError(file, name, None, f"type {got}, expected fixed-size list of {dtype}")
    if got.list_size != width:
        raise BlockLogError(
            file,
            name,
            None,
            f"list size {got.list_size}, but metadata says M = {shape.M}, K = {shape.K} "
            f"(expected {width})",
        )
