"""A straightforward per-row, pure-Python twin of the vectorized tally (slow; for checking).

Every block is walked position by position with Python scalars, following the definitions in
the module docstrings of :mod:`~brisk.mechanism.replay`, :mod:`~brisk.mechanism.coverage`,
:mod:`~brisk.mechanism.likelihood` and :mod:`~brisk.mechanism.repetition`. Tests and the
benchmark require :func:`reference_tally` to equal :func:`~brisk.mechanism.tally.tally_blocks`
exactly, and :func:`reference_rates` to equal the summary's headline numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from brisk.mechanism.columns import BlockBatch
from brisk.mechanism.coverage import PROB_SCALE
from brisk.mechanism.likelihood import LOGP_SCALE
from brisk.mechanism.reader import read_blocks
from brisk.mechanism.replay import SAMPLED_RTOL
from brisk.mechanism.schema import UNKNOWN_VERIFICATION, Decoder, LogShape, Verification
from brisk.mechanism.tally import MAX_FEATURES, RequestTally

__all__ = ["reference_rates", "reference_tally"]


def _accept(p: float, q: float, u: float) -> bool:
    alpha = min(1.0, p / q) if q > 0 else (1.0 if p > 0 else 0.0)
    return u < alpha


def _factual(row: dict[str, Any], i: int, v: Verification) -> bool | None:
    """The log's own rule on the verified token at position i; None: not replayable there."""
    rank = row["head_choice"][i] if v.draft_law == "head" else row["base_choice"][i]
    if rank < 0:
        return None  # the selector did not run here: nothing was verified from it
    x = row["cand_ids"][i][rank]
    if v.rule == "greedy":
        return bool(x == row["verifier_top1"][i])
    if v.draft_law == "head":
        return None
    p, q, u = row["p"][i][rank], row["q"][i][rank], row["u"][i]
    if v.draft_law == "unknown":
        return bool(_accept(p, q, u))
    if v.draft_law == "q_topk":
        total = float(np.sum(np.asarray(row["q"][i], dtype=np.float64)))
        q = q / total if total > 0 else 0.0
    threshold = float(u * q)
    if abs(threshold - p) <= SAMPLED_RTOL * max(threshold, p):
        return None  # within float32 rounding of the threshold
    return bool(threshold < p)


def _repeats(anchor: int, x: list[int]) -> tuple[list[bool], list[bool]]:
    adj = [x[i] == (anchor if i == 0 else x[i - 1]) for i in range(len(x))]
    non = [not adj[i] and x[i] in x[: max(i - 1, 0)] for i in range(len(x))]
    return adj, non


def _block(row: dict[str, Any], M: int, K: int, v: Verification) -> dict[str, list[int]]:
    L = row["accept_len"]
    base, head = row["base_choice"], row["head_choice"]
    cand, q, p, u = row["cand_ids"], row["q"], row["p"], row["u"]
    f: dict[str, list[int]] = {}

    def put(name: str, i: int, value: int, width: int = 1) -> None:
        f.setdefault(name, [0] * width)[i] += value

    put("blocks", 0, 1)
    put("head_positions", 0, sum(c >= 0 for c in head))
    put("accept_len", L, 1, M + 1)
    f["last_block"] = [row["block_index"] * (M + 1) + L]
    f["unchecked"] = [0 if v.rule == "greedy" or v.draft_law != "head" else 1]
    x_base = [cand[i][base[i]] for i in range(M)]
    own = row["head_block"]  # the head's free-running block: whole-block diagnostics
    whole = all(c >= 0 for c in own)
    x_own = [cand[i][own[i]] if whole else -1 for i in range(M)]
    adj, non = _repeats(row["anchor"], x_base)
    h_adj, h_non = _repeats(row["anchor"], x_own)
    for name in ("fb", "fb_head", "rescue", "interv_fb", "acc_head", "regress", "interv_acc"):
        put(name, 0, 0, M)
    for name in ("contradicts", "verified", "adj_verified", "non_verified", "adj_fb", "non_fb"):
        put(name, 0, 0)
    for name in ("adj_fb_head", "non_fb_head", "adj_fb_rescue", "non_fb_rescue"):
        put(name, 0, 0)
    for i in range(min(L + 1, M)):
        ran = head[i] >= 0
        if v.rule == "greedy":
            top1 = row["verifier_top1"][i]
            jb, jh = cand[i][base[i]] == top1, ran and cand[i][head[i]] == top1
        else:
            jb = _accept(p[i][base[i]], q[i][base[i]], u[i])
            jh = ran and _accept(p[i][head[i]], q[i][head[i]], u[i])
        put("verified", 0, 1)
        put("adj_verified", 0, int(adj[i]))
        put("non_verified", 0, int(non[i]))
        said = _factual(row, i, v)
        if said is not None and said != (i < L):
            put("contradicts", 0, 1)
        if i < L and ran:
            put("acc_head", i, 1)
            put("regress", i, int(jb and not jh))
            put("interv_acc", i, int(head[i] != base[i]))
        if i == L:
            put("fb", i, 1)
            put("adj_fb", 0, int(adj[i]))
            put("non_fb", 0, int(non[i]))
            if ran:
                rescued = int(not jb and jh)
                put("fb_head", i, 1)
                put("rescue", i, rescued)
                put("interv_fb", i, int(head[i] != base[i]))
                put("adj_fb_head", 0, int(adj[i]))
                put("non_fb_head", 0, int(non[i]))
                put("adj_fb_rescue", 0, rescued * adj[i])
                put("non_fb_rescue", 0, rescued * non[i])
    # coverage at the first breaker
    f["cov_rank"], f["mass_rank"] = [0] * (K + 1), [0] * (K + 1)
    f["top1_mass"], f["set_mass"] = [0], [0] * K
    if L < M:
        top1 = row["verifier_top1"][L]
        rank = cand[L].index(top1) if top1 in cand[L] else K
        w = round(row["verifier_top1_prob"][L] * PROB_SCALE)
        f["cov_rank"][rank] = 1
        f["mass_rank"][rank] = w
        f["top1_mass"][0] = w
        running = 0
        for k in range(K):
            running += round(p[L][k] * PROB_SCALE)
            f["set_mass"][k] = min(running, PROB_SCALE)
    # whole-block likelihood
    b, h = row["base_logp"], row["head_logp"]
    paired = not (math.isnan(b) or math.isnan(h))
    delta = h - b if paired else 0.0
    f["pairs"] = [int(paired)]
    f["dl"] = [round(delta * LOGP_SCALE) if paired else 0]
    f["dl_pos"], f["dl_tie"], f["dl_neg"] = (
        [int(delta > 0)],
        [int(paired and delta == 0)],
        [int(delta < 0)],
    )
    f["head_blocks"] = [int(whole)]
    f["base_adj"], f["base_non"] = [sum(adj) * whole], [sum(non) * whole]
    f["head_adj"], f["head_non"] = [sum(h_adj) * whole], [sum(h_non) * whole]
    return f


def reference_tally(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Iterable[BlockBatch],
    limit: int | None = None,
) -> RequestTally:
    """Per-request sums computed row by row (the first ``limit`` rows, if given).

    ``source`` is a log (paths) or batches already read.
    """
    per_request: dict[int, dict[str, list[int]]] = {}
    shape: LogShape | None = None
    verification = UNKNOWN_VERIFICATION
    decoder: Decoder = "isd"
    seen = 0
    items = [source] if isinstance(source, str | os.PathLike) else list(source)
    batches: Iterable[BlockBatch]
    if items and all(isinstance(b, BlockBatch) for b in items):
        batches = [b for b in items if isinstance(b, BlockBatch)]
    else:
        batches = read_blocks([b for b in items if not isinstance(b, BlockBatch)])
    for batch in batches:
        shape, verification, decoder = batch.shape, batch.verification, batch.decoder
        M, K = shape.M, shape.K
        cols = {name: arr.tolist() for name, arr in batch.columns.items()}
        for r in range(len(batch)):
            if limit is not None and seen >= limit:
                break
            seen += 1
            row = {name: values[r] for name, values in cols.items()}
            feats = _block(row, M, K, batch.verification)
            acc = per_request.setdefault(row["request_id"], {})
            for name, values in feats.items():
                old = acc.setdefault(name, [-1 if name in MAX_FEATURES else 0] * len(values))
                for j, value in enumerate(values):
                    old[j] = max(old[j], value) if name in MAX_FEATURES else old[j] + value
    if shape is None:
        raise ValueError("reference_tally: no blocks")
    ids = sorted(per_request)
    names = per_request[ids[0]].keys()
    sums = {n: np.array([per_request[i][n] for i in ids], dtype=np.int64) for n in names}
    return RequestTally(shape, np.array(ids, dtype=np.int64), sums, verification, decoder)


def reference_rates(tally: RequestTally) -> dict[str, tuple[float, float]]:
    """(equal-request, pooled) headline rates, by plain Python loops over requests."""
    s = {k: v.tolist() for k, v in tally.sums.items()}
    R = tally.n_requests

    def rate(num: list[int], den: list[int]) -> tuple[float, float]:
        per = [n / d for n, d in zip(num, den, strict=True) if d > 0]
        equal = sum(per) / len(per) if per else math.nan
        return equal, (sum(num) / sum(den) if sum(den) else math.nan)

    def total(name: str, cols: slice = slice(None)) -> list[int]:
        return [sum(s[name][r][cols]) for r in range(R)]

    K = tally.shape.K
    return {
        "rescue": rate(total("rescue"), total("fb_head")),
        "regression": rate(total("regress"), total("acc_head")),
        "intervention": rate(total("interv_fb"), total("fb_head")),
        "coverage@K": rate(total("cov_rank", slice(0, K)), total("cov_rank")),
        "mass@K": rate(total("mass_rank", slice(0, K)), total("top1_mass")),
        "positive": rate(total("dl_pos"), total("pairs")),
        "tied": rate(total("dl_tie"), total("pairs")),
        "negative": rate(total("dl_neg"), total("pairs")),
        "adjacent_first_breakers": rate(total("adj_fb"), total("fb")),
    }
