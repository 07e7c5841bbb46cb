"""Same-state replay (paper, eq:mech_same_draw): first breakers, rescue, regression, intervention.

Positions are 1-based in the text and 0-based in arrays. For a block with accepted-prefix length
L, positions 1..L are *accepted*, position L + 1 is the *first breaker* when L < M, and the
positions after it were never verified.

The diagnostic keeps the factual state (prefix, Top-K support C_i, full-vocabulary-normalized
**base** q_i, verifier p_i and draw u_i) and changes only the token at one position:

    α_i(x) = min(1, p_i(x) / q_i(x)),    J_i(x) = 1[u_i < α_i(x)].

Both the base token and the head's token are scored with the *base* q_i — never with π_i, the
law the corrector actually samples from. This is the paper's fixed-base-q rule: it isolates the
effect of the token choice at an unchanged state, and is not the runtime's acceptance rule
min(1, p/π) (a gain in p/q need not mean a gain in p; whole-block ΔL checks that separately).
Where q_i(x) = 0, α = 1 if p_i(x) > 0 and α = 0 otherwise.

- rescue: J(base) = 0 and J(head) = 1 at a first breaker, per first breaker where the head ran;
- regression: J(base) = 1 and J(head) = 0 at an accepted position, per accepted position where
  the head ran;
- intervention: head choice ≠ base choice, at first breakers (and at accepted positions).

Positions with ``head_choice = −1`` (the head did not run) are left out of the head statistics'
numerators and denominators alike. A reached position where J(base) contradicts ``accept_len``
(a log not produced by this rule, e.g. greedy verification) is counted in
``base_disagreements`` so such logs are visible, but the statistics still follow the paper's
definitions: a rescue needs J(base) = 0 *and* a factual first breaker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.checks import reached_mask
from brisk.mechanism.io import BlockBatch
from brisk.mechanism.stats import Bootstrap, Rate, RateArray

__all__ = ["BlockState", "SameStateReplay", "same_state_accept", "same_state_replay"]

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def same_state_accept(
    p: npt.ArrayLike, q: npt.ArrayLike, u: npt.ArrayLike
) -> npt.NDArray[np.bool_]:
    """J = 1[u < min(1, p/q)] (paper, eq:mech_same_draw), elementwise in float64.

    Where q = 0, α = 1[p > 0].

    >>> same_state_accept([0.2, 0.5, 0.3], [0.4, 0.25, 0.0], [0.6, 0.99, 0.5]).tolist()
    [False, True, True]
    """
    p64 = np.asarray(p, dtype=np.float64)
    q64 = np.asarray(q, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q64 > 0, p64 / np.where(q64 > 0, q64, 1.0), np.where(p64 > 0, 1.0, 0.0))
    return np.asarray(np.asarray(u, dtype=np.float64) < np.minimum(1.0, ratio))


@dataclass(frozen=True, eq=False)
class BlockState:
    """Per-batch masks and tokens every diagnostic needs, computed once ([n, M] arrays).

    ``x_base`` / ``x_head`` are the tokens the base selector and the head picked at each
    position on the factual prefix (``head_choice``; ``x_head`` is −1 where the head did not
    run). ``x_head_block`` is the head's own free-running block (``head_block``), −1 throughout
    where ``head_block_ran`` ([n]) is false: the whole-block diagnostics read it.
    """

    M: int
    K: int
    accept_len: npt.NDArray[np.int64]
    reached: BoolArray
    accepted: BoolArray
    first_breaker: BoolArray
    head_ran: BoolArray
    intervene: BoolArray
    J_base: BoolArray
    J_head: BoolArray
    x_base: npt.NDArray[np.int32]
    x_head: npt.NDArray[np.int32]
    head_block_ran: BoolArray
    x_head_block: npt.NDArray[np.int32]

    @classmethod
    def of(cls, batch: BlockBatch) -> BlockState:
        M, K = batch.shape.M, batch.shape.K
        L = batch["accept_len"].astype(np.int64)
        pos = np.arange(M)
        base = batch["base_choice"].astype(np.int64)[..., None]
        head_raw = batch["head_choice"].astype(np.int64)
        head_ran = head_raw >= 0
        head = np.maximum(head_raw, 0)[..., None]
        own = batch["head_block"].astype(np.int64)
        own_ran = np.asarray((own >= 0).all(axis=1))
        q, p, cand = batch["q"], batch["p"], batch["cand_ids"]
        u = batch["u"]

        def pick(a: npt.NDArray[Any], idx: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
            return np.take_along_axis(a, idx, axis=-1)[..., 0]

        with np.errstate(invalid="ignore"):  # NaN p/u past the first breaker: masked below
            J_base = same_state_accept(pick(p, base), pick(q, base), u)
            J_head = same_state_accept(pick(p, head), pick(q, head), u) & head_ran
        return cls(
            M=M,
            K=K,
            accept_len=L,
            reached=reached_mask(L, M),
            accepted=pos < L[:, None],
            first_breaker=pos == L[:, None],
            head_ran=head_ran,
            intervene=head_ran & (head_raw != base[..., 0]),
            J_base=J_base,
            J_head=J_head,
            x_base=pick(cand, base),
            x_head=np.where(head_ran, pick(cand, head), -1).astype(np.int32),
            head_block_ran=own_ran,
            x_head_block=np.where(
                own_ran[:, None], pick(cand, np.maximum(own, 0)[..., None]), -1
            ).astype(np.int32),
        )


def replay_features(state: BlockState) -> dict[str, npt.NDArray[Any]]:
    """Per-block event indicators, [n, M] each, summed per request by the tally."""
    fb_head = state.first_breaker & state.head_ran
    acc_head = state.accepted & state.head_ran
    contradicts = state.reached & (state.J_base != state.accepted)
    return {
        "head_positions": state.head_ran.sum(axis=1, keepdims=True),
        "fb": state.first_breaker,
        "fb_head": fb_head,
        "rescue": fb_head & ~state.J_base & state.J_head,
        "interv_fb": state.first_breaker & state.intervene,
        "acc_head": acc_head,
        "regress": acc_head & state.J_base & ~state.J_head,
        "interv_acc": state.accepted & state.intervene,
        "base_disagree": contradicts.sum(axis=1, keepdims=True),
    }


@dataclass(frozen=True)
class SameStateReplay:
    """Same-state replay results; ``*_by_position`` arrays run over positions 1..M.

    ``rescue`` is per first breaker, ``regression`` per accepted position (the table shows
    both per 100); ``intervention`` is at first breakers, ``intervention_accepted`` at
    accepted positions. Denominators count only positions where the head ran;
    ``head_positions`` counts them all (reached or not): 0 means the log has no corrector.
    """

    head_positions: int
    first_breakers: int
    first_breakers_by_position: IntArray
    head_missing_at_first_breakers: int
    base_disagreements: int
    rescue: Rate
    regression: Rate
    intervention: Rate
    intervention_accepted: Rate
    rescue_by_position: RateArray
    regression_by_position: RateArray
    intervention_by_position: RateArray

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if isinstance(value, Rate | RateArray):
                out[key] = value.as_dict()
            elif isinstance(value, np.ndarray):
                out[key] = value.tolist()
            else:
                out[key] = value
        return out


def same_state_replay(sums: dict[str, IntArray], boot: Bootstrap) -> SameStateReplay:
    """Rates from per-request sums ([R, M] arrays of :func:`replay_features`)."""
    fb, fb_head = sums["fb"], sums["fb_head"]
    acc_head = sums["acc_head"]
    overall = boot.rates(
        np.stack(
            [sums[k].sum(axis=1) for k in ("rescue", "regress", "interv_fb", "interv_acc")], 1
        ),
        np.stack([fb_head.sum(1), acc_head.sum(1), fb_head.sum(1), acc_head.sum(1)], 1),
    )
    M = fb.shape[1]
    by_pos = boot.rates(
        np.concatenate([sums["rescue"], sums["regress"], sums["interv_fb"]], axis=1),
        np.concatenate([fb_head, acc_head, fb_head], axis=1),
    )
    return SameStateReplay(
        head_positions=int(sums["head_positions"].sum()),
        first_breakers=int(fb.sum()),
        first_breakers_by_position=fb.sum(axis=0),
        head_missing_at_first_breakers=int(fb.sum() - fb_head.sum()),
        base_disagreements=int(sums["base_disagree"].sum()),
        rescue=overall[0],
        regression=overall[1],
        intervention=overall[2],
        intervention_accepted=overall[3],
        rescue_by_position=by_pos.slice(0, M),
        regression_by_position=by_pos.slice(M, 2 * M),
        intervention_by_position=by_pos.slice(2 * M, 3 * M),
    )
