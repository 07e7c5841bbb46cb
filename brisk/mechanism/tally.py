"""One streaming pass over block logs: per-request sums of every diagnostic's event counts.

Each batch is validated, turned into per-block integer features ([n, c] arrays from
:mod:`~brisk.mechanism.replay`, :mod:`~brisk.mechanism.coverage`,
:mod:`~brisk.mechanism.likelihood` and :mod:`~brisk.mechanism.repetition`), and summed per
request; the per-batch partial sums are merged at the end. Memory therefore grows with the
number of requests (about 1 KB each at M = 7, K = 16: 129 int64 sums), not with blocks.
All sums are int64 (probabilities and ΔL in fixed point), so a tally is exactly the same
however the blocks are ordered or split across files. One feature is a maximum, not a sum:
``last_block`` = block_index · (M + 1) + L of the request's last block, which says whether its
last verify round rejected (what the request table needs to close its renewal cycles).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.columns import DEFAULT_BATCH_ROWS, BlockBatch
from brisk.mechanism.coverage import coverage_features
from brisk.mechanism.discover import log_files
from brisk.mechanism.likelihood import likelihood_features
from brisk.mechanism.reader import read_blocks
from brisk.mechanism.repetition import repetition_features
from brisk.mechanism.replay import BlockState, replay_features
from brisk.mechanism.schema import (
    UNKNOWN_VERIFICATION,
    BlockLogError,
    Decoder,
    LogShape,
    Verification,
)
from brisk.theory import AcceptanceProfile

__all__ = ["RequestTally", "block_features", "tally_batches", "tally_blocks"]

IntArray = npt.NDArray[np.int64]
MAX_FEATURES = frozenset({"last_block"})  # reduced per request by max, every other by sum
Paths = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


def block_features(batch: BlockBatch) -> dict[str, npt.NDArray[Any]]:
    """Every per-block feature of one batch as integer or bool arrays [n, c]."""
    state = BlockState.of(batch)
    feats: dict[str, npt.NDArray[Any]] = {"blocks": np.ones((len(batch), 1), dtype=np.int64)}
    feats |= replay_features(state)
    feats |= coverage_features(batch, state)
    feats |= likelihood_features(batch)
    feats |= repetition_features(batch, state)
    L = state.accept_len
    feats["accept_len"] = (L[:, None] == np.arange(state.M + 1)).astype(np.int64)
    feats["last_block"] = batch["block_index"].astype(np.int64) * (state.M + 1) + L
    # bool indicators stay bool here: the per-request reduction sums them as int64
    return {k: v.reshape(len(batch), -1) for k, v in feats.items()}


@dataclass(frozen=True, eq=False)
class RequestTally:
    """Per-request sums ``sums[name]`` of shape [R, c], rows in sorted ``request_ids`` order.

    ``sums["accept_len"][r, k]`` counts request r's blocks with L = k; ``sums["last_block"]``
    is a maximum, not a sum (module docstring). ``verification`` and ``decoder`` are the
    blocks' (every batch of a log shares them).
    """

    shape: LogShape
    request_ids: IntArray
    sums: Mapping[str, IntArray]
    verification: Verification = UNKNOWN_VERIFICATION
    decoder: Decoder = "isd"

    @property
    def n_blocks(self) -> int:
        return int(self.sums["blocks"].sum())

    @property
    def last_accept_len(self) -> IntArray:
        """[R] L of each request's last block (the one with the highest block index)."""
        return self.sums["last_block"][:, 0] % (self.shape.M + 1)

    @property
    def n_requests(self) -> int:
        return int(self.request_ids.size)

    def profile(self) -> AcceptanceProfile:
        """Pooled acceptance profile: position i reached iff L ≥ i − 1, accepted iff L ≥ i."""
        at_least = np.cumsum(self.sums["accept_len"].sum(axis=0)[::-1])[::-1]
        return AcceptanceProfile(at_least[:-1].copy(), at_least[1:].copy())

    def equals(self, other: RequestTally) -> bool:
        """Exact equality of ids and every sum (tallies are integers)."""
        return (
            self.shape == other.shape
            and np.array_equal(self.request_ids, other.request_ids)
            and self.sums.keys() == other.sums.keys()
            and all(np.array_equal(v, other.sums[k]) for k, v in self.sums.items())
        )


def _group_sum(
    ids: IntArray, feats: Mapping[str, npt.NDArray[Any]]
) -> tuple[IntArray, dict[str, IntArray]]:
    """Sum rows of each [n, c] array by id; returns sorted unique ids and [R, c] sums."""
    if ids.size > 1 and not np.all(ids[1:] >= ids[:-1]):
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        feats = {k: v[order] for k, v in feats.items()}
    starts = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
    return ids[starts], {
        k: (np.maximum if k in MAX_FEATURES else np.add).reduceat(v, starts, axis=0, dtype=np.int64)
        for k, v in feats.items()
    }


def tally_blocks(
    paths: Paths,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Callable[[int], None] | None = None,
) -> RequestTally:
    """Validate and tally the logs in one streaming pass.

    ``progress`` is called with the number of rows of each batch once it is done. Raises
    :class:`~brisk.mechanism.schema.BlockLogError` on the first malformed row or for an empty log.
    """
    files = log_files(paths)
    tally = tally_batches(read_blocks(files, batch_rows=batch_rows), progress)
    if tally is None:
        raise BlockLogError(str(files[0]), "(any)", 0, "the log has no blocks")
    return tally


def tally_batches(
    batches: Iterable[BlockBatch], progress: Callable[[int], None] | None = None
) -> RequestTally | None:
    """Tally already-read (and checked) batches; ``None`` when there are no rows."""
    partial_ids: list[IntArray] = []
    partial: dict[str, list[IntArray]] = {}
    shape: LogShape | None = None
    verification = UNKNOWN_VERIFICATION
    decoder: Decoder = "isd"
    for batch in batches:
        shape, verification, decoder = batch.shape, batch.verification, batch.decoder
        ids, sums = _group_sum(batch["request_id"].astype(np.int64), block_features(batch))
        partial_ids.append(ids)
        for k, v in sums.items():
            partial.setdefault(k, []).append(v)
        if progress is not None:
            progress(len(batch))
    if shape is None or not partial_ids:
        return None
    ids, sums = _group_sum(
        np.concatenate(partial_ids), {k: np.concatenate(v) for k, v in partial.items()}
    )
    return RequestTally(shape, ids, sums, verification, decoder)
