"""The request table of a block log: one row per finished request, beside its blocks.

Blocks alone cannot give the TPF a user sees. A request's forwards include its prefill (the
forward over the whole prompt, which commits the first output token) and, under ISD, its cold
starts (the forward after the prefill, and one after every rejection it continued from), its
output is cut at EOS or the token budget, and a request that ends before its first verify round
has no block at all. So when a request finishes, the decoder writes one row of what it cost:

=================  ======  =========================================================
column             type    meaning
=================  ======  =========================================================
``request_id``     int64   the ``request_id`` of its blocks
``prompt_tokens``  int64   prompt length (ISD: its first block has token_offset = this + 2,
                           the prefill commits output token 1, the cold start token 2;
                           speculative: this + 1, the prefill commits the first anchor)
``output_tokens``  int64   n, tokens output (EOS included; ≥ 1)
``forwards``       int64   F, forwards including the prefill (which commits the first token)
``verify_rounds``  int64   R, verify rounds, i.e. blocks of this request in the log
``finished``       string  ``"eos"`` or ``"length"`` (the token budget)
=================  ======  =========================================================

What F can be depends on the log's decoder family (:data:`~brisk.mechanism.schema.Decoder`,
recorded in every block part and request file), and :func:`check_requests` holds each row to it:

- ``"isd"``: F = 1 + cold starts + R, so F = 1 when n = 1 (the prefill alone), else
  R + 2 ≤ F ≤ 2·R + 2; n ≤ 1 + cold starts + (M + 1)·R;
- ``"speculative"``: target forwards only, F = 1 + R exactly (the prefill, then one verify round
  per block); n ≤ 1 + (M + 1)·R.

Either way n ≥ F (every forward commits a token at least).

Rows live in ``requests-NNNNNN.parquet`` files in the log directory (in each rank folder of a
directory of rank folders, :func:`brisk.mechanism.discover.log_folders`), written atomically
after the block parts they describe, so a request that has a row has all its blocks on disk;
blocks of requests without a row (unfinished when the log closed, or a log from a writer that
keeps no table) still feed every diagnostic but no TPF. M, the format version and the decoder
family are in the schema metadata, as for the parts, and must be the blocks'; and
``brisk.requests_version`` says how ``forwards`` counts: ``2``, the prefill included (above). A
request file without it was written when the prefill covered the prompt but its last token,
committed nothing and was not counted; its rows are refused (:func:`read_requests`), since their
forwards mean something else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from brisk.mechanism.discover import Paths, request_files
from brisk.mechanism.reader import log_decoder
from brisk.mechanism.schema import (
    FORMAT_VERSION,
    BlockLogError,
    Decoder,
    decoder_metadata,
    decoder_of,
)

__all__ = ["FINISHED", "REQUEST_COLUMNS", "RequestTable", "read_requests", "request_table"]

FINISHED: tuple[str, ...] = ("eos", "length")
_INT_COLUMNS = ("request_id", "prompt_tokens", "output_tokens", "forwards", "verify_rounds")
REQUEST_COLUMNS: tuple[str, ...] = (*_INT_COLUMNS, "finished")
REQUESTS_VERSION = 2
"""Version of the request table's meaning: 2, ``forwards`` includes the prefill."""
_META_REQUESTS_VERSION = b"brisk.requests_version"

IntArray = npt.NDArray[np.int64]


def request_schema(M: int, decoder: Decoder = "isd") -> pa.Schema:
    fields = [pa.field(name, pa.int64(), nullable=False) for name in _INT_COLUMNS]
    fields.append(pa.field("finished", pa.string(), nullable=False))
    meta = {
        b"brisk.M": str(M).encode(),
        b"brisk.version": str(FORMAT_VERSION).encode(),
        _META_REQUESTS_VERSION: str(REQUESTS_VERSION).encode(),
    } | decoder_metadata(decoder)
    return pa.schema(fields, metadata=meta)


def request_table(
    columns: Mapping[str, Any], M: int, file: str = "<requests>", decoder: Decoder = "isd"
) -> pa.Table:
    """An Arrow table of request rows from arrays, checked row by row (:func:`check_requests`)
    as rows of a ``decoder`` log."""
    missing = [c for c in REQUEST_COLUMNS if c not in columns]
    if missing:
        raise BlockLogError(file, missing[0], None, "missing")
    n = len(np.asarray(columns["request_id"]))
    cols: dict[str, npt.NDArray[Any]] = {}
    for name in _INT_COLUMNS:
        raw = np.asarray(columns[name])
        if raw.shape != (n,):
            raise BlockLogError(file, name, None, f"expected shape ({n},), got {raw.shape}")
        if raw.size and raw.dtype.kind not in "iu":
            raise BlockLogError(file, name, None, f"expected integers, got {raw.dtype}")
        cols[name] = raw.astype(np.int64)
    cols["finished"] = np.asarray(columns["finished"], dtype=object).reshape(n)
    check_requests(cols, M, file, decoder=decoder)
    return pa.Table.from_pydict(
        {name: cols[name].tolist() for name in REQUEST_COLUMNS}, schema=request_schema(M, decoder)
    )


def check_requests(
    cols: Mapping[str, npt.NDArray[Any]],
    M: int,
    file: str,
    row0: int = 0,
    *,
    decoder: Decoder = "isd",
) -> None:
    """Raise :class:`BlockLogError` at the first row that cannot describe a request of the
    ``decoder`` family (module docstring)."""
    R, F, n = cols["verify_rounds"], cols["forwards"], cols["output_tokens"]
    if decoder == "isd":
        # cold starts: a verify round follows one, so there is one at least when R ≥ 1; the
        # prefill and a cold start commit 1 token each, a verify round at most M + 1
        cold = F - 1 - R
        bad_forwards = (cold < np.minimum(R, 1)) | (cold > R + 1)
        forwards_are = "outside [rounds + 2, 2·rounds + 2] (1 or 2 without a round)"
        most = 1 + cold + (M + 1) * R
    else:  # the prefill commits 1 token, a verify round at most M + 1; no cold starts
        bad_forwards = F != 1 + R
        forwards_are = "not rounds + 1 (the prefill and one verify forward per round)"
        most = 1 + (M + 1) * R
    for column, bad, problem in (
        ("prompt_tokens", cols["prompt_tokens"] < 1, "below 1"),
        ("verify_rounds", R < 0, "negative"),
        ("forwards", bad_forwards, forwards_are),
        ("output_tokens", (n < 1) | (n > most), "more than its forwards commit"),
        ("output_tokens", n < F, "fewer than its forwards (each commits one token at least)"),
        ("finished", ~np.isin(cols["finished"], FINISHED), f"not one of {', '.join(FINISHED)}"),
    ):
        rows = np.flatnonzero(bad)
        if rows.size:
            r = int(rows[0])
            raise BlockLogError(file, column, row0 + r, f"{cols[column][r]!r} is {problem}")


@dataclass(frozen=True, eq=False)
class RequestTable:
    """Every request row of a log, sorted by ``request_id`` (ids unique), as int64 arrays;
    ``files`` are the files they came from, ``file_index`` / ``file_row`` where each row sits."""

    files: tuple[str, ...]
    request_id: IntArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    forwards: IntArray
    verify_rounds: IntArray
    finished: npt.NDArray[np.object_]
    file_index: IntArray
    file_row: IntArray

    def __len__(self) -> int:
        return int(self.request_id.size)

    def where(self, r: int) -> tuple[str, int]:
        """(file, row within it) of row r, for error messages."""
        return self.files[int(self.file_index[r])], int(self.file_row[r])


def read_requests(paths: Paths, M: int, decoder: Decoder | None = None) -> RequestTable | None:
    """The request rows of the logs, checked (M and the decoder family against each file's, the
    table's version, every row as that family's, unique ids); None when no log directory has a
    request file. ``M`` and ``decoder`` are the blocks' (``decoder`` None: read from the
    logs' parts, :func:`~brisk.mechanism.reader.log_decoder`)."""
    logs = [paths] if isinstance(paths, str | os.PathLike) else list(paths)  # read twice
    files = request_files(logs)
    if not files:
        return None
    if decoder is None:
        decoder = log_decoder(logs)
    parts: list[dict[str, npt.NDArray[Any]]] = []
    for index, path in enumerate(files):
        file = str(path)
        try:
            table = pq.read_table(file, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as err:
            problem = f"not a readable Parquet file: {' '.join(str(err).split())}"
            raise BlockLogError(str(file), "(file)", None, problem) from None
        meta = table.schema.metadata or {}
        if meta.get(b"brisk.M") != str(M).encode():
            got = (meta.get(b"brisk.M") or b"?").decode()
            raise BlockLogError(str(file), "(schema metadata)", None, f"M = {got}, blocks have {M}")
        if (written_by := decoder_of(table.schema, file)) != decoder:
            problem = f"brisk.decoder {written_by!r}, but the blocks have {decoder!r}"
            raise BlockLogError(file, "(schema metadata)", None, problem)
        if meta.get(_META_REQUESTS_VERSION) != str(REQUESTS_VERSION).encode():
            got = (meta.get(_META_REQUESTS_VERSION) or b"absent").decode()
            problem = (
                f"brisk.requests_version {got}: a request table written before forwards counted "
                "the prefill (which now commits the first token); its TPFs mean something else. "
                "Decode again, or move its requests-*.parquet away to report the blocks alone"
            )
            raise BlockLogError(str(file), "(schema metadata)", None, problem)
        absent = [c for c in REQUEST_COLUMNS if c not in table.column_names]
        if absent:
            raise BlockLogError(str(file), absent[0], None, "missing")
        cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in REQUEST_COLUMNS}
        for c in _INT_COLUMNS:
            if cols[c].dtype != np.int64:
                raise BlockLogError(str(file), c, None, f"type {cols[c].dtype}, expected int64")
        check_requests(cols, M, str(file), decoder=decoder)
        cols["file_index"] = np.full(table.num_rows, index, dtype=np.int64)
        cols["file_row"] = np.arange(table.num_rows, dtype=np.int64)
        parts.append(cols)
    cols = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    order = np.argsort(cols["request_id"], kind="stable")
    out = RequestTable(tuple(map(str, files)), **{c: v[order] for c, v in cols.items()})
    dup = np.flatnonzero(out.request_id[1:] == out.request_id[:-1])
    if dup.size:
        (file, row), (again, row2) = out.where(int(dup[0])), out.where(int(dup[0]) + 1)
        problem = f"request {out.request_id[dup[0]]} already has a row ({file}, row {row})"
        raise BlockLogError(again, "request_id", row2, problem)
    return out
