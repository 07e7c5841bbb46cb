"""Row-level checks of a block batch, vectorized; the first violation becomes a BlockLogError.

The writer runs them before anything reaches disk and the reader runs them on every batch, so a
report never silently averages over a malformed row. Per column, the reported row is the first
bad one; columns are checked in schema order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.schema import BlockLogError, LogShape

__all__ = ["check_columns", "reached_mask"]

IntArray = npt.NDArray[np.int64]


def reached_mask(accept_len: npt.NDArray[np.integer], M: int) -> npt.NDArray[np.bool_]:
    """[B, M] mask of verified positions: position i (1-based) is reached iff i ≤ L + 1."""
    return np.arange(M) <= np.asarray(accept_len)[:, None]


def check_columns(
    cols: Mapping[str, npt.NDArray[Any]], shape: LogShape, file: str, row0: int = 0
) -> None:
    """Raise :class:`BlockLogError` at the first row that breaks the contract.

    ``cols`` holds [B], [B, M] or [B, M, K] arrays as returned by the reader (any subset of
    the columns; checks that need a missing column are skipped, except that value checks
    which depend on reachability need ``accept_len``).
    """
    M, K = shape.M, shape.K

    def fail(column: str, bad: npt.NDArray[np.bool_], problem: str) -> None:
        flat = bad.reshape(bad.shape[0], -1) if bad.ndim > 1 else bad[:, None]
        rows = np.flatnonzero(flat.any(axis=1))
        if rows.size == 0:
            return
        r = int(rows[0])
        detail = ""
        if bad.ndim >= 2:
            idx = np.unravel_index(int(np.argmax(flat[r])), bad.shape[1:])
            detail = f" (position {int(idx[0]) + 1}" + (
                f", candidate rank {int(idx[1])})" if len(idx) > 1 else ")"
            )
        raise BlockLogError(file, column, row0 + r, problem + detail)

    def within(v: npt.NDArray[Any], lo: float, hi: float, nan_ok: bool = False) -> bool:
        # fast path: two reductions; masks are only built once something is wrong
        if v.size == 0:
            return True
        if nan_ok:
            return bool(np.fmin.reduce(v, axis=None) >= lo and np.fmax.reduce(v, axis=None) <= hi)
        return bool(v.min() >= lo and v.max() <= hi)  # NaN compares False

    accept_len = cols.get("accept_len")
    reached = None
    if accept_len is not None:
        if not within(accept_len, 0, M):
            fail(
                "accept_len",
                (accept_len < 0) | (accept_len > M),
                f"accept_len outside [0, M = {M}]",
            )
        reached = reached_mask(accept_len, M)
    if (v := cols.get("block_index")) is not None and not within(v, 0, np.inf):
        fail("block_index", v < 0, "negative block index")
    if (v := cols.get("token_offset")) is not None:
        if not within(v, 1, np.inf):
            fail("token_offset", v < 1, "below 1 (x_0 sits at token_offset − 1 ≥ 0)")
        _check_offsets_in_order(cols, file, row0)
    if (v := cols.get("anchor")) is not None and not within(v, 0, np.inf):
        fail("anchor", v < 0, "negative token id")
    if (v := cols.get("cand_ids")) is not None:
        if not within(v, 0, np.inf):
            fail("cand_ids", v < 0, "negative token id")
        ordered = np.sort(v, axis=-1)
        dup = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)
        fail("cand_ids", np.asarray(dup), "candidate ids not unique within the position")
    if (v := cols.get("q")) is not None and not within(v, 0, 1):
        fail("q", ~((v >= 0) & (v <= 1)), "q outside [0, 1] (or NaN)")
    if (v := cols.get("base_choice")) is not None and not within(v, 0, K - 1):
        fail("base_choice", (v < 0) | (v >= K), f"choice index outside [0, K = {K})")
    if (v := cols.get("head_choice")) is not None and not within(v, -1, K - 1):
        fail("head_choice", (v < -1) | (v >= K), f"choice index outside [−1, K = {K})")
    if (v := cols.get("head_block")) is not None:
        if not within(v, -1, K - 1):
            fail("head_block", (v < -1) | (v >= K), f"choice index outside [−1, K = {K})")
        ran = np.asarray(v >= 0)
        partial = np.asarray(ran.any(axis=1) & ~ran.all(axis=1))
        if partial.any():
            fail(
                "head_block",
                partial[:, None] & ~ran,
                "−1 at some positions only (the head's own block is whole, or −1 throughout)",
            )
    for name, per_candidate in (("p", True), ("verifier_top1_prob", False), ("u", False)):
        v = cols.get(name)
        if v is None:
            continue
        if not within(v, 0, 1, nan_ok=True):
            fail(name, ~np.isnan(v) & ~((v >= 0) & (v <= 1)), f"{name} outside [0, 1]")
        if reached is not None:
            # a NaN anywhere among a position's K values makes that position's sum NaN
            nan_at = np.isnan(v.sum(axis=-1) if per_candidate else v) & reached
            if nan_at.any():
                at = reached[:, :, None] if per_candidate else reached
                fail(name, np.isnan(v) & at, "NaN at a reached position")
    if (v := cols.get("verifier_top1")) is not None:
        if not within(v, -1, np.inf):
            fail("verifier_top1", v < -1, "token id below −1")
        if reached is not None:
            fail("verifier_top1", (v < 0) & reached, "missing (−1) at a reached position")
    for name in ("base_logp", "head_logp"):
        v = cols.get(name)
        if v is None:
            continue
        if not within(v, -np.inf, 0, nan_ok=True) or np.isinf(v).any():
            # NaN stands for a null (not scored); anything else must be a log-probability
            fail(name, ~np.isnan(v) & ~(np.isfinite(v) & (v <= 0)), "must be finite and ≤ 0")


def _check_offsets_in_order(cols: Mapping[str, npt.NDArray[Any]], file: str, row0: int) -> None:
    """token_offset must not decrease as block_index grows within a request (among these rows).

    Blocks of one request in other batches or parts are not compared: that would need every
    block's offset in memory at once.
    """
    rid, bix, off = (cols.get(c) for c in ("request_id", "block_index", "token_offset"))
    if rid is None or bix is None or off is None or off.size < 2:
        return
    # fast path: each request's rows form one run in increasing block order (a writer's
    # request-by-request dump); otherwise sort by (request, block, offset)
    same = rid[1:] == rid[:-1]
    run_ids = rid[np.flatnonzero(np.concatenate([[True], ~same]))]
    grouped = np.unique(run_ids).size == run_ids.size and bool(np.all(~same | (bix[1:] > bix[:-1])))
    order: IntArray = (
        np.arange(off.size) if grouped else np.lexsort((off, bix, rid)).astype(np.int64)
    )
    r, b, o = rid[order], bix[order], off[order]
    dec = np.flatnonzero((r[1:] == r[:-1]) & (b[1:] > b[:-1]) & (o[1:] < o[:-1]))
    if dec.size:
        j = int(dec[0])
        before, row = int(order[j]), int(order[j + 1])
        raise BlockLogError(
            file,
            "token_offset",
            row0 + row,
            f"{int(o[j + 1])} at block {int(b[j + 1])} of request {int(r[j + 1])}, but block "
            f"{int(b[j])} (row {row0 + before}) starts later, at {int(o[j])}",
        )
