"""Hand-built and random block logs for the mechanism tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from brisk.mechanism import synthetic_blocks

NAN = float("nan")

# the small synthetic log of the checks, reader and writer tests: M, K, blocks, and the row
# every value-level case corrupts
SMALL_M, SMALL_K, SMALL_N, BAD_ROW = 7, 16, 40, 23


def small_columns() -> dict[str, Any]:
    """The columns of the small synthetic log (4 requests, seed 11)."""
    return next(synthetic_blocks(SMALL_N, SMALL_M, SMALL_K, n_requests=4, seed=11))


def write_parquet(path: Path, table: pa.Table) -> Path:
    """``table`` as one Parquet file at ``path``, bypassing the writer."""
    pq.write_table(table, path)
    return path


def set_bad(name: str, index: tuple[int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation that sets ``name[BAD_ROW, *index]`` of the columns to ``value``."""

    def mutate(c: dict[str, Any]) -> None:
        c[name] = c[name].copy()
        c[name][(BAD_ROW, *index)] = value

    return mutate


def hand_block(
    request_id: int,
    block_index: int,
    accept_len: int,
    p: Sequence[Sequence[float]],
    u: Sequence[float],
    base: Sequence[int],
    head: Sequence[int],
    *,
    q: Sequence[float] = (0.5, 0.3, 0.2),
    top1: Sequence[int] | None = None,
    top1_prob: Sequence[float] | None = None,
    logp: tuple[float, float] = (NAN, NAN),
    anchor: int = 1,
    cand: Sequence[Sequence[int]] | None = None,
    head_block: Sequence[int] | None = None,
    token_offset: int | None = None,
) -> dict[str, Any]:
    """One block of a log with M = len(u) positions and K = len(q) candidates.

    Candidates of position i default to ids 10·i + k (unique, no repeats); ``p`` rows past the
    first breaker may be NaN; ``top1`` defaults to −1 / NaN past the first breaker and to the
    argmax of p inside C_i elsewhere. ``head_block`` defaults to ``head`` (head-on decoding),
    ``token_offset`` to 20 + 10 · block_index.
    """
    M, K = len(u), len(q)
    cand_ids = np.array(
        cand if cand is not None else [[10 * i + k for k in range(K)] for i in range(1, M + 1)]
    )
    p_arr = np.array(p, dtype=np.float64)
    reached = np.arange(M) <= accept_len
    if top1 is None:
        arg = np.nan_to_num(p_arr, nan=-1).argmax(axis=1)
        top1 = [int(cand_ids[i, arg[i]]) if reached[i] else -1 for i in range(M)]
        top1_prob = [float(p_arr[i, arg[i]]) if reached[i] else NAN for i in range(M)]
    return {
        "request_id": request_id,
        "block_index": block_index,
        "anchor": anchor,
        "cand_ids": cand_ids,
        "q": np.tile(np.array(q), (M, 1)),
        "p": p_arr,
        "verifier_top1": np.array(top1),
        "verifier_top1_prob": np.array(top1_prob, dtype=np.float64),
        "u": np.array(u, dtype=np.float64),
        "base_choice": np.array(base),
        "head_choice": np.array(head),
        "head_block": np.array(head if head_block is None else head_block),
        "token_offset": 20 + 10 * block_index if token_offset is None else token_offset,
        "accept_len": accept_len,
        "base_logp": logp[0],
        "head_logp": logp[1],
    }


def stack(blocks: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Column arrays of a list of blocks."""
    return {k: np.stack([np.asarray(b[k]) for b in blocks]) for k in blocks[0]}


def random_columns(
    rng: np.random.Generator, n: int, R: int, M: int, K: int, head_is_base: bool = False
) -> dict[str, np.ndarray]:
    """A valid random log with edge values (exact 0/1 probabilities and draws) drawn often."""

    def probs(shape: tuple[int, ...]) -> np.ndarray:
        x = rng.random(shape)
        edge = rng.random(shape)
        return np.where(edge < 0.1, 0.0, np.where(edge > 0.9, 1.0, x))

    L = rng.integers(0, M + 1, n)
    reached = np.arange(M) <= L[:, None]
    cand = np.argsort(rng.random((n, M, K)), axis=-1) + rng.integers(0, 4, (n, M, 1)) * K
    # a small id range makes adjacent and non-adjacent repeats common
    p = probs((n, M, K)).astype(np.float32)
    p[~reached] = np.nan
    base = rng.integers(0, K, (n, M))
    head = base.copy() if head_is_base else rng.integers(-1, K, (n, M))
    if not head_is_base:
        head[rng.random(n) < 0.2] = -1
    # the head's own block: its per-position choices (head-on) or another block (shadow mode);
    # whole or −1 throughout
    own = np.where(rng.random((n, 1)) < 0.5, head, rng.integers(0, K, (n, M)))
    own[(own < 0).any(axis=1) | (rng.random(n) < 0.15)] = -1
    if head_is_base:
        own = base.copy()
    top1 = np.where(reached, rng.integers(0, 6 * K, (n, M)), -1)
    logp = -rng.exponential(1.0, (n, 2))
    tie = rng.random(n) < 0.3
    logp[tie, 1] = logp[tie, 0]
    logp[rng.random(n) < 0.1] = np.nan
    return {
        "request_id": rng.choice(np.array([7, -3, 10**12, 42, 0, 99]), R, replace=False)[
            rng.integers(0, R, n)
        ],
        "block_index": np.arange(n),
        "token_offset": np.cumsum(rng.integers(1, M + 2, n)),
        "anchor": rng.integers(0, 3 * K, n),
        "cand_ids": cand,
        "q": probs((n, M, K)),
        "p": p,
        "verifier_top1": top1,
        "verifier_top1_prob": np.where(reached, probs((n, M)), np.nan),
        "u": probs((n, M)),
        "base_choice": base,
        "head_choice": head,
        "head_block": own,
        "accept_len": L,
        "base_logp": logp[:, 0],
        "head_logp": np.where(head_is_base, logp[:, 0], logp[:, 1]),
    }


@st.composite
def random_logs(draw: st.DrawFn, head_is_base: bool = False) -> tuple[dict[str, Any], int, int]:
    """(columns, M, K) of a random log: M in {1, 2, 3, 7}, K in 1..5, 1..6 requests."""
    M = draw(st.sampled_from([1, 2, 3, 7]))
    K = draw(st.integers(1, 5))
    n = draw(st.integers(1, 40))
    R = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return random_columns(rng, n, R, M, K, head_is_base), M, K


def as_version_1(table: pa.Table) -> pa.Table:
    """The same rows in the version 1 layout: no token_offset / head_block, version 1 metadata."""
    meta = dict(table.schema.metadata) | {b"brisk.version": b"1"}
    return table.drop_columns(["token_offset", "head_block"]).replace_schema_metadata(meta)
