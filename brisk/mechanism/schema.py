"""The block-log schema: one Parquet row per proposal block (docs/architecture.md,
"mechanism: the contract").

Columns (B blocks, M proposal positions, K candidates per position; lists are fixed-size and
flattened position-major, so entry ``i·K + k`` is candidate k of position i + 1):

=====================  ==================  ====================================================
column                 type                meaning
=====================  ==================  ====================================================
``request_id``         int64               request the block belongs to
``block_index``        int64               index of the block within its request
``token_offset``       int64               index of x_1 in the request's token sequence (prompt
                                           then generated tokens, 0-based); ≥ 1, x_0 sits at
                                           ``token_offset − 1``, so ``sequence[:token_offset]``
                                           is the context the block was proposed from;
                                           non-decreasing in ``block_index`` within a request
``anchor``             int32               x_0, the committed token just before the block
``cand_ids``           int32 [M·K]         C_i, the Top-K token ids of q_i, by q descending
``q``                  float32 [M·K]       base proposal q_i(C_i[k]) (full-vocab normalized)
``p``                  float32 [M·K]       verifier p_i(C_i[k]) under the factual prefix;
                                           NaN where not computed (positions not reached)
``verifier_top1``      int32 [M]           argmax of p_i over the full vocabulary (−1: unreached)
``verifier_top1_prob`` float32 [M]         p_i(verifier_top1) (NaN: unreached)
``u``                  float64 [M]         acceptance draw u_i (NaN allowed where unreached)
``base_choice``        int16 [M]           rank into C_i the base selector took
``head_choice``        int16 [M]           rank into C_i the corrector takes at position i on
                                           the *factual* prefix (per-position, same-state);
                                           −1 where the head did not run
``head_block``         int16 [M]           ranks into C_i of the head's own free-running block
                                           (its earlier choices fed back); −1 at every
                                           position when the head did not draft a block
``accept_len``         int16               L, accepted-prefix length, 0..M
``base_logp``          float64, nullable   whole-block L(b_base | c) (paper,
                                           eq:mech_block_logp), optional
``head_logp``          float64, nullable   whole-block L(b_head | c) (paper,
                                           eq:mech_block_logp) of the ``head_block``
                                           tokens, optional
=====================  ==================  ====================================================

Position i (1-based) is *reached* when i ≤ min(L + 1, M); the reached positions are the
verified ones, and the *first breaker* is position L + 1 when L < M. M, K and the format version
live in the schema metadata under ``brisk.M``, ``brisk.K`` and ``brisk.version``; how the blocks
were verified (:class:`Verification`) under ``brisk.verification``, ``brisk.draft_law`` and
``brisk.temperature``; the decoder family that wrote them (:data:`Decoder`) under
``brisk.decoder``, in the request files too (a file without it reads as ``"isd"``).

``head_choice`` feeds the per-position same-state diagnostics (rescue, regression, intervention:
one token changed at an unchanged state); ``head_block`` feeds the whole-block ones (the head's
block's repeats, and the block ``head_logp`` scores). When the head decodes (head-on), the
factual prefix is the head's own and the two columns are equal; in shadow mode (the base
decodes, the head only proposes) they differ after the head's first disagreement with the base.

Versions. Version 3 records the verification (a file without it reads as
:data:`UNKNOWN_VERIFICATION`) and adds the request table beside the parts
(:mod:`brisk.mechanism.requests`). Version 2 added ``token_offset`` and ``head_block`` and
writes Parquet page checksums (:class:`~brisk.mechanism.writer.BlockLogWriter`). Readers still take
version 1 files: they read as ``token_offset = −1`` (unknown) and ``head_block = head_choice``
(all version 1 recorded), and are validated as version 1 (no checksums to verify, no checks on
the two columns). A log's parts
may mix versions as long as each part is consistent in itself; they must share M and K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = [
    "DECODERS",
    "FORMAT_VERSION",
    "OPTIONAL_COLUMNS",
    "PER_CANDIDATE_COLUMNS",
    "PER_POSITION_COLUMNS",
    "READABLE_VERSIONS",
    "REQUIRED_COLUMNS",
    "UNKNOWN_VERIFICATION",
    "BlockLogError",
    "CorruptBlockLogError",
    "Decoder",
    "LogShape",
    "Verification",
    "block_schema",
    "decoder_metadata",
    "decoder_of",
    "describe_decoder",
    "required_columns",
    "schema_info",
]

FORMAT_VERSION = 3
READABLE_VERSIONS: tuple[int, ...] = (1, 2, 3)

_META_M, _META_K, _META_VERSION = b"brisk.M", b"brisk.K", b"brisk.version"
_META_RULE, _META_LAW, _META_T = b"brisk.verification", b"brisk.draft_law", b"brisk.temperature"
_META_DECODER = b"brisk.decoder"

Rule = Literal["greedy", "sampled", "unknown"]
DraftLaw = Literal["argmax", "q", "q_topk", "head", "unknown"]
_LAWS: dict[str, tuple[str, ...]] = {
    "greedy": ("argmax", "head"),
    "sampled": ("q", "q_topk", "head"),
    "unknown": ("unknown",),
}


@dataclass(frozen=True)
class Verification:
    """How a log's blocks were verified: what ``accept_len`` means, and so which same-state
    rule the replay applies and which check ``accept_len`` must pass.

    - ``rule = "greedy"``: x_i accepted iff it is the verifier's argmax (``verifier_top1``);
      ``u`` played no part. ``draft_law`` is ``"argmax"`` (the base's top candidate) or
      ``"head"`` (the corrector's choice).
    - ``rule = "sampled"``: x_i accepted iff u_i · π_i(x_i) < p_i(x_i), π_i the law the draft
      was drawn from (paper, sec:idlm_background): ``"q"`` (the full-vocabulary q, where this
      is exactly eq:mech_same_draw), ``"q_topk"`` (q restricted to C_i and renormalized,
      brisk's base drafts at T > 0), or ``"head"`` (the corrector's softmax over C_i, which the
      log does not hold).
    - ``rule = "unknown"``: the writer was not told, or a version 1 or 2 log.

    ``temperature`` is the one p and q were taken at (1 when greedy); NaN when unknown.

    >>> Verification("greedy", "argmax", 1.0).factual_is_head
    False
    """

    rule: Rule
    draft_law: DraftLaw
    temperature: float

    def __post_init__(self) -> None:
        if self.rule not in _LAWS:
            raise ValueError(f"rule: need one of {', '.join(_LAWS)}, got {self.rule!r}")
        if self.draft_law not in _LAWS[self.rule]:
            laws = ", ".join(_LAWS[self.rule])
            raise ValueError(
                f"draft_law: a {self.rule} log's drafts come from {laws}; got {self.draft_law!r}"
            )
        known = math.isfinite(self.temperature) and self.temperature > 0
        if self.rule != "unknown" and not known:
            raise ValueError(f"temperature: need a finite T > 0, got {self.temperature!r}")

    @property
    def factual_is_head(self) -> bool:
        """Whether the verified tokens are the head's (``head_choice``) rather than the base's."""
        return self.draft_law == "head"

    def describe(self) -> str:
        """One phrase for reports, e.g. ``greedy (x_i accepted iff it is p_i's argmax)``."""
        return {
            "greedy": "greedy: x_i accepted iff it is the verifier's argmax",
            "sampled": f"sampled at T = {self.temperature:g}: x_i accepted iff "
            f"u_i·π_i(x_i) < p_i(x_i), π = {_LAW_WORDS[self.draft_law]}",
            "unknown": "not recorded in the log",
        }[self.rule]

    def metadata(self) -> dict[bytes, bytes]:
        return {
            _META_RULE: self.rule.encode(),
            _META_LAW: self.draft_law.encode(),
            _META_T: repr(float(self.temperature)).encode(),
        }


_LAW_WORDS = {
    "q": "the full-vocabulary q",
    "q_topk": "q restricted to C_i",
    "head": "the corrector's softmax over C_i",
    "argmax": "a point mass",
    "unknown": "unknown",
}

UNKNOWN_VERIFICATION = Verification("unknown", "unknown", math.nan)
"""What a version 1 or 2 log reads as."""

Decoder = Literal["isd", "speculative"]
"""The decoder family that wrote a log: what a request's forwards are, so which request rows
are possible (:func:`brisk.mechanism.requests.check_requests`) and which renewal cycles and
cost model its TPFs count (:mod:`brisk.mechanism.runs`).

- ``"isd"``: introspective strided decoding. The prefill commits output token 1, a cold start
  (after the prefill and after every rejection) 1 token, a verify round L + 1; a block's
  token_offset starts at prompt + 2.
- ``"speculative"``: a drafter proposes, an autoregressive target verifies
  (:mod:`brisk.runtime.drafter.speculative`); forwards are the target's: the prefill (output
  token 1, the first anchor) and one verify round per block (L + 1 tokens), no cold starts; a
  block's token_offset starts at prompt + 1.
"""
DECODERS: tuple[Decoder, ...] = ("isd", "speculative")
_DECODER_WORDS: dict[str, str] = {
    "isd": "ISD: the prefill, cold starts (after it and after every rejection) and verify rounds",
    "speculative": "speculative: the prefill and one target verify round per block, "
    "no cold starts (the drafter's forwards are not counted)",
}


def describe_decoder(decoder: Decoder) -> str:
    """One phrase for reports: the family and the forwards it counts.

    >>> describe_decoder("speculative").split(":")[0]
    'speculative'
    """
    return _DECODER_WORDS[decoder]


def decoder_metadata(decoder: Decoder) -> dict[bytes, bytes]:
    """The metadata entry that records ``decoder`` (one of :data:`DECODERS`) in a block part or
    a request file; a ValueError for any other value, so a writer refuses it up front."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder: need one of {', '.join(DECODERS)}, got {decoder!r}")
    return {_META_DECODER: decoder.encode()}


def decoder_of(schema: pa.Schema, file: str) -> Decoder:
    """The decoder family a file's metadata records: ``"isd"`` when it has none (every log
    written before the key); raise :class:`BlockLogError` for a value not in :data:`DECODERS`."""
    raw = (schema.metadata or {}).get(_META_DECODER, b"isd").decode(errors="replace")
    for decoder in DECODERS:
        if raw == decoder:
            return decoder
    problem = f"brisk.decoder {raw!r}, this brisk reads {', '.join(DECODERS)}"
    raise BlockLogError(file, "(schema metadata)", None, problem)


# (name, element type, list length: "MK", "M" or None for a scalar column, version added)
_COLUMNS: tuple[tuple[str, pa.DataType, str | None, int], ...] = (
    ("request_id", pa.int64(), None, 1),
    ("block_index", pa.int64(), None, 1),
    ("token_offset", pa.int64(), None, 2),
    ("anchor", pa.int32(), None, 1),
    ("cand_ids", pa.int32(), "MK", 1),
    ("q", pa.float32(), "MK", 1),
    ("p", pa.float32(), "MK", 1),
    ("verifier_top1", pa.int32(), "M", 1),
    ("verifier_top1_prob", pa.float32(), "M", 1),
    ("u", pa.float64(), "M", 1),
    ("base_choice", pa.int16(), "M", 1),
    ("head_choice", pa.int16(), "M", 1),
    ("head_block", pa.int16(), "M", 2),
    ("accept_len", pa.int16(), None, 1),
)
_OPTIONAL: tuple[tuple[str, pa.DataType], ...] = (
    ("base_logp", pa.float64()),
    ("head_logp", pa.float64()),
)

REQUIRED_COLUMNS: tuple[str, ...] = tuple(name for name, _, _, _ in _COLUMNS)
OPTIONAL_COLUMNS: tuple[str, ...] = tuple(name for name, _ in _OPTIONAL)
PER_CANDIDATE_COLUMNS = frozenset(name for name, _, kind, _ in _COLUMNS if kind == "MK")
"""Columns of M·K values, read as [n, M, K]."""
PER_POSITION_COLUMNS = frozenset(name for name, _, kind, _ in _COLUMNS if kind == "M")
"""Columns of M values, read as [n, M]."""


def required_columns(version: int = FORMAT_VERSION) -> tuple[str, ...]:
    """The columns a file of format ``version`` must hold, in schema order.

    >>> sorted(set(required_columns(2)) - set(required_columns(1)))
    ['head_block', 'token_offset']
    """
    if version not in READABLE_VERSIONS:
        raise ValueError(f"version: need one of {READABLE_VERSIONS}, got {version!r}")
    return tuple(name for name, _, _, since in _COLUMNS if since <= version)


class BlockLogError(ValueError):
    """A block log that breaks the schema; the message names the file, column and row.

    ``row`` is the 0-based row within the file (``None`` when the problem is the whole column
    or the file's metadata).
    """

    def __init__(self, file: str, column: str, row: int | None, problem: str) -> None:
        self.file, self.column, self.row, self.problem = file, column, row, problem
        where = "every row" if row is None else f"row {row}"
        super().__init__(f"{file}: column {column!r}, {where}: {problem}")


class CorruptBlockLogError(BlockLogError):
    """A part whose bytes are damaged: a data page fails its checksum or cannot be decoded.

    ``column`` is the column whose pages failed, ``row`` the first row of the row group
    ``row_group`` that holds them (rows ``row`` .. ``row + rows − 1``). The message stays on one
    line, e.g. ``PATH: corrupt Parquet data (page checksum mismatch) in column 'q', rows 0–39
    (row group 0)``.
    """

    def __init__(
        self, file: str, column: str, row_group: int, row: int, rows: int, detail: str
    ) -> None:
        super().__init__(file, column, row, detail)
        self.row_group, self.rows = row_group, rows
        self.args = (
            f"{file}: corrupt Parquet data ({detail}) in column {column!r}, "
            f"rows {row}–{row + rows - 1} (row group {row_group})",
        )


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


def block_schema(
    M: int,
    K: int,
    verification: Verification | None = None,
    *,
    logp: bool = True,
    decoder: Decoder = "isd",
) -> pa.Schema:
    """The Arrow schema of a block log with M positions and K candidates (current version),
    verified as ``verification`` says (None: :data:`UNKNOWN_VERIFICATION`), written by the
    ``decoder`` family.

    >>> s = block_schema(7, 16, Verification("sampled", "q_topk", 1.0))
    >>> s.field("q").type
    FixedSizeListType(fixed_size_list<element: float not null>[112])
    >>> s.field("head_block").type
    FixedSizeListType(fixed_size_list<element: int16 not null>[7])
    >>> s.metadata[b"brisk.M"], s.metadata[b"brisk.K"], s.metadata[b"brisk.version"]
    (b'7', b'16', b'3')
    >>> s.metadata[b"brisk.verification"], s.metadata[b"brisk.draft_law"]
    (b'sampled', b'q_topk')
    >>> s.metadata[b"brisk.decoder"]
    b'isd'
    """
    shape = LogShape(M, K)
    fields = []
    for name, dtype, kind, _ in _COLUMNS:
        width = shape.width(kind)
        typ = (
            dtype if width is None else pa.list_(pa.field("element", dtype, nullable=False), width)
        )
        fields.append(pa.field(name, typ, nullable=False))
    if logp:
        fields.extend(pa.field(name, dtype, nullable=True) for name, dtype in _OPTIONAL)
    meta = {_META_M: str(M).encode(), _META_K: str(K).encode()}
    meta[_META_VERSION] = str(FORMAT_VERSION).encode()
    meta |= (verification or UNKNOWN_VERIFICATION).metadata() | decoder_metadata(decoder)
    return pa.schema(fields, metadata=meta)


def schema_info(schema: pa.Schema, file: str) -> tuple[LogShape, int]:
    """Read and check M, K, format version and column types; raise :class:`BlockLogError` if off.

    Returns the shape and the file's format version (one of ``READABLE_VERSIONS``); the columns
    checked are those that version requires. :func:`verification_of` reads the verification,
    :func:`decoder_of` the decoder family.
    """
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
    version = values[_META_VERSION]
    if version not in READABLE_VERSIONS:
        raise BlockLogError(
            file,
            "(schema metadata)",
            None,
            f"format version {version}, this brisk reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}",
        )
    try:
        shape = LogShape(values[_META_M], values[_META_K])
    except ValueError as err:
        raise BlockLogError(file, "(schema metadata)", None, str(err)) from None
    for name, dtype, kind, since in _COLUMNS:
        if since > version:
            continue
        if schema.get_field_index(name) < 0:
            raise BlockLogError(file, name, None, f"missing (required by format version {version})")
        _check_type(file, name, schema.field(name).type, dtype, shape.width(kind), shape)
    for name, dtype in _OPTIONAL:
        if schema.get_field_index(name) >= 0:
            _check_type(file, name, schema.field(name).type, dtype, None, shape)
    return shape, version


def verification_of(schema: pa.Schema, file: str) -> Verification:
    """The :class:`Verification` a file's metadata records (:data:`UNKNOWN_VERIFICATION`
    for a file before version 3); raise :class:`BlockLogError` if it is missing or unreadable
    in a version 3 file."""
    meta = schema.metadata or {}
    if int(meta.get(_META_VERSION, b"0")) < 3:
        return UNKNOWN_VERIFICATION
    raw: dict[bytes, str] = {}
    for key in (_META_RULE, _META_LAW, _META_T):
        value = meta.get(key)
        if value is None:
            raise BlockLogError(file, "(schema metadata)", None, f"missing {key.decode()!r}")
        raw[key] = value.decode()
    try:
        return Verification(
            raw[_META_RULE],  # type: ignore[arg-type]  # checked by Verification
            raw[_META_LAW],  # type: ignore[arg-type]
            float(raw[_META_T]),
        )
    except ValueError as err:
        raise BlockLogError(file, "(schema metadata)", None, f"verification: {err}") from None


def shape_from_schema(schema: pa.Schema, file: str) -> LogShape:
    """The shape of :func:`schema_info`."""
    return schema_info(schema, file)[0]


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
