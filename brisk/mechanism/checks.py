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
