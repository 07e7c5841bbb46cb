"""Local repetition (paper, app:mech_collision and fig:mech_collision).

With x_0 the anchor and x_1..x_M the block's tokens, position i holds

- an **adjacent** repeat when x_i = x_{i−1} (for i = 1 that is the anchor);
- a **non-adjacent** repeat when x_i equals an earlier token of the block x_1..x_{i−2} and is
  not an adjacent repeat (the anchor counts only as the adjacent neighbour of position 1).

Prevalence is measured on the factual base tokens, among *verified* (reached) positions and
among first breakers, each as an equal-request rate. Head rescue among repeat breakers is the
rescue rate of :mod:`brisk.mechanism.replay` restricted to adjacent- (non-adjacent-) repeat
first breakers where the head ran (a same-state, per-position quantity: it reads
``head_choice``).

Repeats per block compare the base block with the head's own block over all M positions, as in
the paper's paired whole-block replay (0.404 → 0.101 adjacent repeats per block): the head's
tokens are x_i = C_i[head_block_i], the block it drafts choosing left to right with its own
earlier choices fed back, with x_0 the same anchor. In shadow mode this differs from the
per-position ``head_choice`` tokens, each chosen after the *base's* prefix. Only blocks with a
head block (``head_block`` ≠ −1) count, for base and head alike; the numbers are equal-request
means, not rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.columns import BlockBatch
from brisk.mechanism.replay import BlockState
from brisk.mechanism.stats import Bootstrap, Mean, Rate

__all__ = ["Repetition", "repeats", "repetition"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def repeats(anchor: npt.ArrayLike, tokens: npt.ArrayLike) -> tuple[BoolArray, BoolArray]:
    """Adjacent and non-adjacent repeat masks [n, M] for anchors [n] and tokens [n, M].

    >>> adj, non = repeats([5], [[5, 7, 5, 5, 7]])
    >>> adj.astype(int).tolist(), non.astype(int).tolist()
    ([[1, 0, 0, 1, 0]], [[0, 0, 1, 0, 1]])
    """
    x = np.asarray(tokens)
    prev = np.concatenate([np.asarray(anchor).reshape(-1, 1), x[:, :-1]], axis=1)
    adjacent = x == prev
    M = x.shape[1]
    earlier = np.tril(np.ones((M, M), dtype=bool), k=-2)  # j ≤ i − 2
    non = ((x[:, :, None] == x[:, None, :]) & earlier).any(axis=2) & ~adjacent
    return adjacent, non


def _any(mask: BoolArray) -> BoolArray:
    return np.asarray(mask.any(axis=1, keepdims=True))


def repetition_features(batch: BlockBatch, state: BlockState) -> dict[str, npt.NDArray[Any]]:
    """Per-block repeat counts among verified positions and first breakers, and per block
    (base block vs the head's own block)."""
    anchor = batch["anchor"]
    adj, non = repeats(anchor, state.x_base)
    fb, fb_head = state.first_breaker, state.first_breaker & state.head_ran
    rescued = fb_head & ~state.J_base & state.J_head
    whole = state.head_block_ran
    h_adj, h_non = repeats(anchor, state.x_head_block)

    def per_block(mask: BoolArray) -> IntArray:
        return np.where(whole, mask.sum(axis=1), 0)[:, None]

    return {
        "verified": state.reached.sum(axis=1, keepdims=True),
        "adj_verified": (adj & state.reached).sum(axis=1, keepdims=True),
        "non_verified": (non & state.reached).sum(axis=1, keepdims=True),
        "adj_fb": _any(adj & fb),
        "non_fb": _any(non & fb),
        "adj_fb_head": _any(adj & fb_head),
        "non_fb_head": _any(non & fb_head),
        "adj_fb_rescue": _any(adj & rescued),
        "non_fb_rescue": _any(non & rescued),
        "head_blocks": whole[:, None],
        "base_adj": per_block(adj),
        "base_non": per_block(non),
        "head_adj": per_block(h_adj),
        "head_non": per_block(h_non),
    }


@dataclass(frozen=True)
class Repetition:
    """Repeat prevalence (verified positions vs first breakers), head rescue among repeat
    breakers, and repeats per block (base vs head)."""

    adjacent_verified: Rate
    adjacent_first_breakers: Rate
    nonadjacent_verified: Rate
    nonadjacent_first_breakers: Rate
    adjacent_head_rescue: Rate
    nonadjacent_head_rescue: Rate
    paired_blocks: int
    adjacent_per_block_base: Mean
    adjacent_per_block_head: Mean
    nonadjacent_per_block_base: Mean
    nonadjacent_per_block_head: Mean

    def to_dict(self) -> dict[str, Any]:
        return {k: v if isinstance(v, int) else v.to_dict() for k, v in self.__dict__.items()}


def repetition(sums: dict[str, IntArray], boot: Bootstrap) -> Repetition:
    """Repetition statistics from per-request sums of :func:`repetition_features`."""
    s = {k: v[:, 0] for k, v in sums.items() if v.shape[1] == 1}
    n_fb = sums["fb"].sum(axis=1)
    rates = boot.rates(
        np.stack(
            [
                s["adj_verified"],
                s["adj_fb"],
                s["non_verified"],
                s["non_fb"],
                s["adj_fb_rescue"],
                s["non_fb_rescue"],
            ],
            axis=1,
        ),
        np.stack(
            [s["verified"], n_fb, s["verified"], n_fb, s["adj_fb_head"], s["non_fb_head"]],
            axis=1,
        ),
    )
    blocks = s["head_blocks"]
    per_block = boot.means(
        np.stack([s["base_adj"], s["head_adj"], s["base_non"], s["head_non"]], axis=1),
        np.repeat(blocks[:, None], 4, axis=1),
    )
    return Repetition(
        rates[0],
        rates[1],
        rates[2],
        rates[3],
        rates[4],
        rates[5],
        int(blocks.sum()),
        *per_block,
    )
