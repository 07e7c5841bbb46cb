"""Same-state replay (paper, eq:mech_same_draw): first breakers, rescue, regression, intervention.

Positions are 1-based in the text and 0-based in arrays. For a block with accepted-prefix length
L, positions 1..L are *accepted*, position L + 1 is the *first breaker* when L < M, and the
positions after it were never verified.

The diagnostic keeps the factual state (prefix, Top-K support C_i, full-vocabulary-normalized
**base** q_i, verifier p_i and draw u_i) and changes only the token at one position. For a log
verified by sampling (or one that does not say how it was verified) the rule is the paper's

    α_i(x) = min(1, p_i(x) / q_i(x)),    J_i(x) = 1[u_i < α_i(x)].

Both the base token and the head's token are scored with the *base* q_i — never with π_i, the
law the corrector actually samples from. This is the paper's fixed-base-q rule: it isolates the
effect of the token choice at an unchanged state, and is not the runtime's acceptance rule
min(1, p/π) (a gain in p/q need not mean a gain in p; whole-block ΔL checks that separately).
Where q_i(x) = 0, α = 1 if p_i(x) > 0 and α = 0 otherwise. A log verified greedily accepted x_i
iff it was the verifier's argmax, whatever u_i; its same-state rule is that one,
J_i(x) = 1[x = verifier_top1_i].

- rescue: J(base) = 0 and J(head) = 1 at a first breaker, per first breaker where the head ran;
- regression: J(base) = 1 and J(head) = 0 at an accepted position, per accepted position where
  the head ran;
- intervention: head choice ≠ base choice, at first breakers (and at accepted positions).

Positions with ``head_choice = −1`` (the head did not run) are left out of the head statistics'
numerators and denominators alike.

The log's own verification rule (:class:`~brisk.mechanism.schema.Verification`) must reproduce
``accept_len`` from the verified token at every reached position: a greedy log checks the
verified token against ``verifier_top1``, a sampled one u_i · π_i(x_i) < p_i(x_i) with π the
recorded draft law (the full-vocabulary q, or q renormalized over C_i; equality within a
relative 10⁻⁴, for float32 storage). A reached position where it does not is counted in
``contradictions``: the log is not what it says it is. A log drafted by the head at T > 0 cannot
be checked (π, the head's softmax, is not logged), and neither can a sampled log whose
verifier_top1 is all a greedy check would need; a log that does not record its verification is
checked against the paper's rule on the base token. The statistics still follow their
definitions whatever the check finds: a rescue needs J(base) = 0 *and* a factual first breaker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.mechanism.checks import reached_mask
from brisk.mechanism.columns import BlockBatch
from brisk.mechanism.schema import Verification
from brisk.mechanism.stats import Bootstrap, Rate, RateArray

__all__ = [
    "BlockState",
    "SameStateReplay",
    "factual_accept",
    "same_state_accept",
    "same_state_replay",
]

SAMPLED_RTOL = 1e-4  # p and q are stored as float32; the runtime compared them in its own dtype

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


def factual_accept(
    verification: Verification,
    x: npt.NDArray[np.integer],
    rank: npt.NDArray[np.integer],
    batch: BlockBatch,
) -> tuple[BoolArray, BoolArray] | None:
    """What the log's own rule says of the verified tokens ``x`` ([n, M], ranks ``rank`` into
    C_i): (accepted, decided), ``decided`` false where a sampled comparison lies within float32
    rounding of its threshold; None when the rule cannot be replayed from the log (a head
    drafting at T > 0: π is not logged)."""
    ran = np.asarray(rank >= 0)  # a selector that did not run verified nothing to check
    if verification.rule == "greedy":
        return np.asarray(x == batch["verifier_top1"]), ran
    if verification.draft_law == "head":
        return None
    q, p, u = batch["q"], batch["p"], batch["u"]
    idx = np.maximum(rank, 0).astype(np.int64)[..., None]
    q_x = np.take_along_axis(q, idx, -1)[..., 0].astype(np.float64)
    p_x = np.take_along_axis(p, idx, -1)[..., 0].astype(np.float64)
    if verification.draft_law == "q_topk":  # π = q renormalized over C_i (0 if C_i has none)
        total = q.astype(np.float64).sum(axis=-1)
        q_x = np.where(total > 0, q_x / np.where(total > 0, total, 1.0), 0.0)
    if verification.draft_law == "unknown":
        return same_state_accept(p_x, q_x, u), ran
    with np.errstate(invalid="ignore"):  # NaN p/u past the first breaker: masked by the caller
        threshold = u * q_x
        accepted = np.asarray(threshold < p_x)
        decided = np.abs(threshold - p_x) > SAMPLED_RTOL * np.maximum(threshold, p_x)
    return accepted, np.asarray(decided & ran)


@dataclass(frozen=True, eq=False)
class BlockState:
    """Per-batch masks and tokens every diagnostic needs, computed once ([n, M] arrays).

    ``x_base`` / ``x_head`` are the tokens the base selector and the head picked at each
    position on the factual prefix (``head_choice``; ``x_head`` is −1 where the head did not
    run). ``x_head_block`` is the head's own free-running block (``head_block``), −1 throughout
    where ``head_block_ran`` ([n]) is false: the whole-block diagnostics read it. ``J_base`` and
    ``J_head`` follow the log's same-state rule (module docstring); ``contradicts`` marks reached
    positions where the log's own verification rule disagrees with ``accept_len``, and
    ``checked`` whether the rule could be replayed at all.
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
    contradicts: BoolArray
    checked: bool

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

        x_base = pick(cand, base)
        x_head = np.where(head_ran, pick(cand, head), -1).astype(np.int32)
        v = batch.verification
        if v.rule == "greedy":
            top1 = batch["verifier_top1"]
            J_base, J_head = x_base == top1, (x_head == top1) & head_ran
        else:
            with np.errstate(invalid="ignore"):  # NaN p/u past the first breaker: masked below
                J_base = same_state_accept(pick(p, base), pick(q, base), u)
                J_head = same_state_accept(pick(p, head), pick(q, head), u) & head_ran
        reached, accepted = reached_mask(L, M), pos < L[:, None]
        if v.factual_is_head:  # the head drafted: its tokens were the ones verified
            factual = factual_accept(v, x_head, head_raw, batch)
        else:
            factual = factual_accept(v, x_base, base[..., 0], batch)
        if factual is None:
            contradicts = np.zeros_like(reached)
        else:
            said, decided = factual
            contradicts = reached & decided & (said != accepted)
        return cls(
            M=M,
            K=K,
            accept_len=L,
            reached=reached,
            accepted=accepted,
            first_breaker=pos == L[:, None],
            head_ran=head_ran,
            intervene=head_ran & (head_raw != base[..., 0]),
            J_base=np.asarray(J_base),
            J_head=np.asarray(J_head),
            x_base=x_base,
            x_head=x_head,
            head_block_ran=own_ran,
            x_head_block=np.where(
                own_ran[:, None], pick(cand, np.maximum(own, 0)[..., None]), -1
            ).astype(np.int32),
            contradicts=np.asarray(contradicts),
            checked=factual is not None,
        )


def replay_features(state: BlockState) -> dict[str, npt.NDArray[Any]]:
    """Per-block event indicators, [n, M] each, summed per request by the tally."""
    fb_head = state.first_breaker & state.head_ran
    acc_head = state.accepted & state.head_ran
    return {
        "head_positions": state.head_ran.sum(axis=1, keepdims=True),
        "fb": state.first_breaker,
        "fb_head": fb_head,
        "rescue": fb_head & ~state.J_base & state.J_head,
        "interv_fb": state.first_breaker & state.intervene,
        "acc_head": acc_head,
        "regress": acc_head & state.J_base & ~state.J_head,
        "interv_acc": state.accepted & state.intervene,
        "contradicts": state.contradicts.sum(axis=1, keepdims=True),
        "unchecked": np.full((len(state.accept_len), 1), not state.checked),
    }


@dataclass(frozen=True)
class SameStateReplay:
    """Same-state replay results; ``*_by_position`` arrays run over positions 1..M.

    ``rescue`` is per first breaker, ``regression`` per accepted position (the table shows
    both per 100); ``intervention`` is at first breakers, ``intervention_accepted`` at
    accepted positions. Denominators count only positions where the head ran;
    ``head_positions`` counts them all (reached or not): 0 means the log has no corrector.
    ``contradictions`` counts reached positions where the log's own verification rule disagrees
    with ``accept_len``; ``unchecked_blocks`` the blocks whose rule could not be replayed.
    """

    head_positions: int
    first_breakers: int
    first_breakers_by_position: IntArray
    head_missing_at_first_breakers: int
    contradictions: int
    unchecked_blocks: int
    rescue: Rate
    regression: Rate
    intervention: Rate
    intervention_accepted: Rate
    rescue_by_position: RateArray
    regression_by_position: RateArray
    intervention_by_position: RateArray

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if isinstance(value, Rate | RateArray):
                out[key] = value.to_dict()
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
        contradictions=int(sums["contradicts"].sum()),
        unchecked_blocks=int(sums["unchecked"].sum()),
        rescue=overall[0],
        regression=overall[1],
        intervention=overall[2],
        intervention_accepted=overall[3],
        rescue_by_position=by_pos.slice(0, M),
        regression_by_position=by_pos.slice(M, 2 * M),
        intervention_by_position=by_pos.slice(2 * M, 3 * M),
    )
