"""Seeded synthetic block logs that look like a real server's (for tests, notebook, benchmark).

Requests differ in length (log-normal block counts) and in acceptance level (a per-request
logit offset); the position profile declines along the block. Each position's Top-K draws
q from a random softmax, the verifier either agrees with the base choice or prefers another
candidate (sometimes one outside C_i), and the factual accepted-prefix length comes from the
same-state rule applied to the base choices, so J(base) always agrees with ``accept_len``.
Adjacent and non-adjacent repetitions are injected into the base tokens and make rejection
likelier.

The log simulates shadow mode: the base decodes, and a head runs beside it (on 97 % of the
blocks; −1 elsewhere). Its per-position choice on the base's prefix (``head_choice``) usually
follows the verifier's top-1 when the base token is rejected (rescues), avoids adjacent repeats,
and now and then swaps an accepted token for a worse one (regressions). Its own free-running
block (``head_block``) equals ``head_choice`` up to and including the first position where the
head departs from the base; from there on the head sees its own prefix, so each later choice
keeps ``head_choice`` with probability 0.8 (else q's top candidate) and steps off a token that
repeats the head's own previous token with probability 0.75. ``head_logp`` scores that block.

``token_offset`` starts at a per-request prompt length + 2 (16..511: the prefill commits output
token 1, and the anchor is token 2, the one the request's opening cold start committed) and
grows by L + 1 per block, the tokens an ISD round commits. :func:`synthetic_requests` gives the
matching request table: the prefill and the opening cold start, every rejection but a
request's last followed by a cold start, and a request ends at its last block.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.replay import same_state_accept
from brisk.mechanism.schema import Verification
from brisk.mechanism.writer import BlockLogWriter

__all__ = ["SYNTHETIC_VERIFICATION", "synthetic_blocks", "synthetic_log", "synthetic_requests"]

SYNTHETIC_VERIFICATION = Verification("sampled", "q", 1.0)
"""How the synthetic blocks are verified: J(base) under the full-vocabulary q decides L."""

_ID_SPAN = 1 << 14  # token ids of position i live in [i·span, (i+1)·span): unique by design


def synthetic_blocks(
    n_blocks: int,
    M: int = 7,
    K: int = 16,
    *,
    n_requests: int | None = None,
    seed: int = 0,
    batch_rows: int = 65_536,
    logp: bool = True,
) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """Yield column dicts (as :meth:`BlockLogWriter.write` takes them) for ``n_blocks`` blocks.

    ``n_requests`` defaults to about one request per 100 blocks. Blocks come request by
    request in block order; request ids are large scattered integers (as hashed ids would be).
    The stream is a pure function of all the arguments (``batch_rows`` included: each batch
    draws from its own generator seeded by (seed, first row)).
    """
    if n_blocks < 1 or M < 1 or K < 2:
        raise ValueError(f"need n_blocks ≥ 1, M ≥ 1, K ≥ 2; got {n_blocks}, {M}, {K}")
    rng = np.random.default_rng(seed)
    R = min(n_blocks, n_requests if n_requests is not None else max(1, n_blocks // 100))
    weights = rng.lognormal(0.0, 1.0, R)
    counts = 1 + rng.multinomial(n_blocks - R, weights / weights.sum())
    ids = np.sort(rng.choice(np.int64(1) << 62, size=R, replace=False))
    ids = rng.permutation(ids)
    level = rng.normal(0.0, 0.8, R)  # per-request acceptance offset (logit scale)
    next_offset = rng.integers(16, 512, R).astype(np.int64)  # prompt lengths + 2, then + L + 1
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    request_of_row = np.repeat(np.arange(R), counts)
    for start in range(0, n_blocks, batch_rows):
        rows = request_of_row[start : start + batch_rows]
        brng = np.random.default_rng([seed, start])
        cols = _batch(
            brng, M, K, ids[rows], start + np.arange(rows.size) - starts[rows], level[rows], logp
        )
        # rows run request by request: offset = the request's next offset + the L + 1 of its
        # earlier rows in this batch
        committed = cols["accept_len"].astype(np.int64) + 1
        before = np.cumsum(committed) - committed
        first = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1]]))
        run_start = np.repeat(first, np.diff(np.append(first, rows.size)))
        cols["token_offset"] = next_offset[rows] + before - before[run_start]
        np.add.at(next_offset, rows, committed)
        yield cols


def synthetic_log(
    path: str | os.PathLike[str],
    n_blocks: int,
    M: int = 7,
    K: int = 16,
    *,
    n_requests: int | None = None,
    seed: int = 0,
) -> BlockLogWriter:
    """Write a synthetic log directory at ``path``: the blocks of :func:`synthetic_blocks`, their
    verification and their request table. Returns the (closed) writer, for its counts."""
    keys = ("request_id", "block_index", "token_offset", "accept_len")
    kept = []
    with BlockLogWriter(path, M, K, verification=SYNTHETIC_VERIFICATION) as writer:
        for batch in synthetic_blocks(n_blocks, M, K, n_requests=n_requests, seed=seed):
            writer.write(batch)
            kept.append({k: batch[k] for k in keys})
        writer.write_requests(synthetic_requests(kept, M))
    return writer


def synthetic_requests(
    batches: Iterable[dict[str, npt.NDArray[Any]]], M: int
) -> dict[str, npt.NDArray[Any]]:
    """The request table (:mod:`brisk.mechanism.requests`) of synthetic blocks, as
    :meth:`~brisk.mechanism.writer.BlockLogWriter.write_requests` takes it: each request opened
    with the prefill (output token 1, a forward) and a cold start (token 2, the first block's
    anchor), cold-started after every rejection but its last block's, and ended at its last
    block (at EOS)."""
    parts = []
    for cols in batches:
        L = cols["accept_len"].astype(np.int64)
        parts.append(
            {
                "request_id": cols["request_id"],
                "block": cols["block_index"],
                "offset": cols["token_offset"],
                "L": L,
            }
        )
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((rows["block"], rows["request_id"]))
    ids, offset, L = (rows[k][order] for k in ("request_id", "offset", "L"))
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    ends = np.append(starts[1:], ids.size) - 1
    rounds = np.diff(np.append(starts, ids.size))
    rejected = np.add.reduceat((L < M).astype(np.int64), starts)
    closed = rejected - (L[ends] < M)
    return {
        "request_id": ids[starts],
        "prompt_tokens": offset[starts] - 2,
        "output_tokens": 2 + np.add.reduceat(L + 1, starts) + closed,
        "forwards": 2 + rounds + closed,
        "verify_rounds": rounds,
        "finished": np.full(starts.size, "eos", dtype=object),
    }


def _batch(
    rng: np.random.Generator,
    M: int,
    K: int,
    request_id: npt.NDArray[np.int64],
    block_index: npt.NDArray[np.int64],
    level: npt.NDArray[np.float64],
    logp: bool,
) -> dict[str, npt.NDArray[Any]]:
    n = request_id.size
    pos = np.arange(M)
    rows = np.arange(n)[:, None]
    # q: a random softmax over the Top-K, descending, holding most of the vocabulary's mass
    gaps = rng.exponential(1.0, (n, M, K)) * rng.uniform(0.4, 1.6, (n, M, 1))
    gaps[..., 0] = 0.0
    logits = -np.cumsum(gaps, axis=-1)
    q = np.exp(logits)
    q *= rng.beta(30, 1.5, (n, M, 1)) / q.sum(axis=-1, keepdims=True)
    # token ids: unique within a position because each position owns an id range
    steps = rng.integers(1, _ID_SPAN // K, (n, M, K)).cumsum(axis=-1)
    cand = (pos[:, None] * _ID_SPAN + (steps * 40_503) % _ID_SPAN).astype(np.int32)
    anchor = (M * _ID_SPAN + rng.integers(0, 1000, n)).astype(np.int32)
    base = np.where(rng.random((n, M)) < 0.9, 0, rng.integers(1, 4, (n, M))).astype(np.int16)
    # inject repetitions into the base tokens, position by position (x_0 = anchor)
    tokens = np.empty((n, M), dtype=np.int32)
    adjacent = np.zeros((n, M), dtype=bool)
    repeat = np.zeros((n, M), dtype=bool)
    for i in range(M):
        prev = anchor if i == 0 else tokens[:, i - 1]
        adj = rng.random(n) < 0.06
        non = ~adj & (rng.random(n) < 0.05) & (i >= 2)
        earlier = tokens[rows[:, 0], rng.integers(0, max(i - 1, 1), n)] if i >= 2 else prev
        cand[adj, i, base[adj, i]] = prev[adj]
        cand[non, i, base[non, i]] = earlier[non]
        tokens[:, i] = cand[rows[:, 0], i, base[:, i]]
        adjacent[:, i], repeat[:, i] = adj, adj | non
    # verifier: agrees with the base token with a request- and position-dependent probability
    z = level[:, None] + 2.3 - 0.28 * pos - 1.2 * adjacent - 0.35 * (repeat & ~adjacent)
    agree = rng.random((n, M)) < 1.0 / (1.0 + np.exp(-z))
    p = q * np.exp(rng.normal(0.0, 0.3, (n, M, K)))
    # the verifier's favourite when disagreeing: usually a near neighbour in q's ranking
    alt = (base + np.minimum(rng.geometric(0.45, (n, M)), K - 1)) % K
    outside = ~agree & (rng.random((n, M)) < 0.05)
    p_base = np.take_along_axis(p, base[..., None], -1)[..., 0]
    p_max = p.max(axis=-1)
    np.put_along_axis(
        p,
        base[..., None].astype(np.int64),
        np.where(
            agree, p_max * rng.uniform(1.2, 2.0, (n, M)), p_base * rng.uniform(0.0, 0.6, (n, M))
        )[..., None],
        -1,
    )
    boost = np.where(~agree & ~outside, p_max * rng.uniform(1.5, 4.0, (n, M)), 0.0)
    alt_p = np.take_along_axis(p, alt[..., None].astype(np.int64), -1)[..., 0]
    np.put_along_axis(p, alt[..., None].astype(np.int64), np.maximum(alt_p, boost)[..., None], -1)
    top_out = rng.uniform(0.5, 0.9, (n, M))  # above anything left inside C_i
    mass = np.where(outside, (1.0 - top_out) * 0.95, rng.uniform(0.85, 0.99, (n, M)))
    p *= (mass / p.sum(axis=-1))[..., None]
    arg = p.argmax(axis=-1)
    top1 = np.where(
        outside,
        (M + 1) * _ID_SPAN + rng.integers(0, 1000, (n, M)),
        np.take_along_axis(cand, arg[..., None], -1)[..., 0],
    ).astype(np.int32)
    top1_prob = np.where(outside, top_out, p.max(axis=-1))
    q, p = q.astype(np.float32), p.astype(np.float32)
    # the factual outcome: same-state rule on the base tokens, stop at the first rejection
    u = rng.random((n, M))
    J_base = _same_state(q, p, u, base)
    accept_len = np.cumprod(J_base, axis=-1).sum(axis=-1).astype(np.int16)
    # shadow head: follow the verifier when it disagrees, dodge adjacent repeats, rarely slip
    favourite = np.where(outside, (base + 1) % K, arg).astype(np.int16)
    follow = ~agree & (rng.random((n, M)) < 0.30 + 0.04 * pos)
    follow |= adjacent & (rng.random((n, M)) < 0.75)
    slip = agree & (rng.random((n, M)) < 0.03)
    head = np.where(follow, favourite, base)
    head = np.where(slip, (base + 1 + rng.integers(0, K - 1, (n, M))) % K, head).astype(np.int16)
    ran = rng.random(n) >= 0.03
    head[~ran] = -1
    own = _own_block(rng, cand, base, head)
    own[~ran] = -1
    logps: dict[str, npt.NDArray[Any]] = {}
    if logp:
        ref = np.maximum(p.astype(np.float64), 1e-30)  # verifier scores every position
        lp_base = np.log(np.take_along_axis(ref, base[..., None].astype(np.int64), -1)[..., 0])
        lp_head = np.log(np.take_along_axis(ref, np.maximum(own, 0)[..., None], -1)[..., 0])
        base_logp = lp_base.sum(axis=-1) - rng.exponential(0.5, n)
        delta = np.where(own != base, lp_head - lp_base + rng.normal(0, 0.2, (n, M)), 0.0)
        # head block == base block gives an exactly tied pair, as a real replay would
        head_logp = base_logp + delta.sum(axis=-1)
        scored = ran & (rng.random(n) >= 0.01)
        logps["base_logp"] = np.where(scored, base_logp, np.nan)
        logps["head_logp"] = np.where(scored, np.minimum(head_logp, 0.0), np.nan)
    # not computed past the first breaker
    unreached = pos > accept_len[:, None]
    p[unreached] = np.nan
    top1[unreached] = -1
    top1_prob = np.where(unreached, np.nan, top1_prob).astype(np.float32)
    cols: dict[str, npt.NDArray[Any]] = {
        "request_id": request_id.astype(np.int64),
        "block_index": block_index.astype(np.int64),
        "anchor": anchor,
        "cand_ids": cand,
        "q": q,
        "p": p,
        "verifier_top1": top1,
        "verifier_top1_prob": top1_prob,
        "u": u,
        "base_choice": base,
        "head_choice": head,
        "head_block": own,
        "accept_len": accept_len,
    }
    return cols | logps


def _own_block(
    rng: np.random.Generator,
    cand: npt.NDArray[np.int32],
    base: npt.NDArray[np.int16],
    head: npt.NDArray[np.int16],
) -> npt.NDArray[np.int16]:
    """The head's free-running block (ranks [n, M]), from its choices on the base's prefix."""
    n, M, K = cand.shape
    rows = np.arange(n)
    own = head.copy()
    departed = np.zeros(n, dtype=bool)  # the head's prefix is no longer the base's
    for i in range(M):
        redraw = departed & (rng.random(n) >= 0.8)
        own[redraw, i] = 0
        if i > 0:
            prev = cand[rows, i - 1, own[:, i - 1]]
            dodge = departed & (cand[rows, i, own[:, i]] == prev) & (rng.random(n) < 0.75)
            own[dodge, i] = (own[dodge, i] + 1) % K
        departed |= own[:, i] != base[:, i]
    return own


def _same_state(
    q: npt.NDArray[np.float32],
    p: npt.NDArray[np.float32],
    u: npt.NDArray[np.float64],
    choice: npt.NDArray[np.int16],
) -> npt.NDArray[np.bool_]:
    idx = choice[..., None].astype(np.int64)
    qc = np.take_along_axis(q, idx, -1)[..., 0]
    pc = np.take_along_axis(p, idx, -1)[..., 0]
    return same_state_accept(pc, qc, u)
