"""Block logging from ISD: one mechanism-schema row per verify round (docs/architecture.md,
"mechanism: the contract").

Each row records the state the replay diagnostics need: where the block sits in its request
(``token_offset``: the index of x_1 in prompt + output, so hidden states can be recomputed), the
Top-K candidates C_i of the base proposal and q over them, the verifier p over them under the
block's own prefix (NaN after the first breaker, whose prefix was never factual), the verifier's
top-1, the acceptance draws u_i, the base's and the head's choices (the head's on the base's
prefix in shadow mode), the head's own free-running block, and L. In greedy decoding u_i is
still drawn, for the replay's same-state rule only. With ``ISDOptions.score_blocks`` the
whole-block log-likelihoods of the base and head blocks from the round's prefix
(eq:mech_block_logp) fill ``base_logp`` / ``head_logp`` (diagnostics: an extra forward over
the rows whose two blocks differ; identical blocks score identically by construction).
:func:`log_verified` writes one round's rows, for brisk's loop and the SGLang worker alike, and
:func:`block_logp` is the whole-block score.

The log records how it was verified (:func:`verification_for`) and the decoder family that
wrote it (``decoder``: ``"isd"`` here, ``"speculative"`` for
:mod:`brisk.runtime.drafter.speculative`, which logs through the same class), and each finished
request adds its row to the request table (:meth:`BlockLogger.log_request`), so a report on the
log shows the TPFs the decode printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from brisk.mechanism import BlockLogWriter
from brisk.mechanism.schema import Decoder, Verification

if TYPE_CHECKING:
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.decode_options import DecodeOptions
    from brisk.runtime.isd.result import RequestOutput
    from brisk.runtime.isd.state import Draft, ISDState, StepResult

__all__ = [
    "BlockLogger",
    "BlockRecord",
    "block_logp",
    "log_verified",
    "token_logp",
    "verification_for",
]


def verification_for(options: DecodeOptions, corrector: Corrector | None) -> Verification:
    """How ISD with ``options`` verifies (:func:`brisk.runtime.isd.batched.verify_block`):
    greedily, or by sampling against the law the draft came from: the corrector's softmax
    when it drafts (head on), else q restricted to its Top-K."""
    head = corrector is not None and not options.shadow
    if options.temperature == 0:
        return Verification("greedy", "head" if head else "argmax", 1.0)
    return Verification("sampled", "head" if head else "q_topk", options.temperature)


@dataclass(frozen=True)
class BlockRecord:
    """Block-log rows as tensors (n blocks, M positions, K candidates); schema in
    :mod:`brisk.mechanism.schema`."""

    request_id: Tensor  # [n] int
    block_index: Tensor  # [n] int
    token_offset: Tensor  # [n] int, index of x_1 in the request's prompt + output
    anchor: Tensor  # [n] x_0
    cand_ids: Tensor  # [n, M, K]
    q: Tensor  # [n, M, K]
    p: Tensor  # [n, M, K] NaN where not reached
    verifier_top1: Tensor  # [n, M] −1 where not reached
    verifier_top1_prob: Tensor  # [n, M] NaN where not reached
    u: Tensor  # [n, M]
    base_choice: Tensor  # [n, M]
    head_choice: Tensor  # [n, M] −1: head not run
    head_block: Tensor  # [n, M] −1: head not run
    accept_len: Tensor  # [n]
    base_logp: Tensor | None = None  # [n] NaN: not scored
    head_logp: Tensor | None = None  # [n]

    @classmethod
    def from_round(
        cls,
        *,
        request_id: Tensor,
        block_index: Tensor,
        draft: Draft,
        verifier_logits: Tensor,
        temperature: float,
        u: Tensor,
        accept_len: Tensor,
        base_logp: Tensor | None = None,
        head_logp: Tensor | None = None,
    ) -> BlockRecord:
        """The rows of one verify round: ``verifier_logits [n, M+1, V]`` from the round's
        forward; p is taken at the decoding temperature (T = 1 when greedy)."""
        if draft.q is None:
            raise ValueError("draft: proposed without logging (no q); decode with a logger")
        M = draft.tokens.shape[1]
        t = temperature if temperature > 0 else 1.0
        p = torch.softmax(verifier_logits[:, :M].double() / t, dim=-1)  # [n, M, V]
        reached = torch.arange(M, device=p.device)[None] <= accept_len[:, None]
        top_prob, top1 = p.max(-1)
        return cls(
            request_id=request_id,
            block_index=block_index,
            token_offset=draft.offset,
            anchor=draft.anchor,
            cand_ids=draft.cand_ids,
            q=draft.q,
            p=p.gather(-1, draft.cand_ids).masked_fill(~reached[..., None], float("nan")),
            verifier_top1=torch.where(reached, top1, -1),
            verifier_top1_prob=torch.where(reached, top_prob, float("nan")),
            u=u,
            base_choice=draft.base_choice,
            head_choice=draft.head_choice,
            head_block=draft.head_block,
            accept_len=accept_len,
            base_logp=base_logp,
            head_logp=head_logp,
        )


class BlockLogger(BlockLogWriter):
    """A :class:`~brisk.mechanism.writer.BlockLogWriter` at ``path`` taking :class:`BlockRecord`;
    ``decoder`` is the family whose rounds and requests it logs (``"speculative"`` for the
    drafter's speculative decoding: its request rows are checked as F = 1 + verify rounds)."""

    collects = False  # the decoder keeps the head's inputs on its drafts for :meth:`log_round`

    def __init__(
        self,
        path: str | Path,
        M: int,
        K: int,
        rows_per_group: int = 4096,
        verification: Verification | None = None,
        decoder: Decoder = "isd",
    ) -> None:
        super().__init__(
            path,
            M,
            K,
            rows_per_group=rows_per_group,
            verification=verification,
            decoder=decoder,
        )
        self.M, self.K = M, K

    def log_request(self, request_id: int, prompt_tokens: int, output: RequestOutput) -> None:
        """The request table's row of a finished request (:mod:`brisk.mechanism.requests`)."""
        self.write_requests(
            {
                "request_id": np.array([request_id], dtype=np.int64),
                "prompt_tokens": np.array([prompt_tokens], dtype=np.int64),
                "output_tokens": np.array([len(output.tokens)], dtype=np.int64),
                "forwards": np.array([output.forwards], dtype=np.int64),
                "verify_rounds": np.array([len(output.accept_lengths)], dtype=np.int64),
                "finished": np.array([output.finished], dtype=object),
            }
        )

    def log_round(self, record: BlockRecord, draft: Draft) -> None:
        """One verify round's rows; ``draft`` is the verified draft (rows as in ``record``).
        Subclasses that set ``collects`` also store what only the draft holds."""
        self.log(record)

    def log(self, record: BlockRecord) -> None:
        if record.cand_ids.shape[1:] != (self.M, self.K):
            raise ValueError(
                f"record: cand_ids has shape [n, {', '.join(map(str, record.cand_ids.shape[1:]))}]"
                f", the log holds M = {self.M}, K = {self.K}"
            )

        def arr(t: Tensor, dtype: type) -> np.ndarray:
            return t.detach().cpu().numpy().astype(dtype)

        columns = {
            "request_id": arr(record.request_id, np.int64),
            "block_index": arr(record.block_index, np.int64),
            "token_offset": arr(record.token_offset, np.int64),
            "anchor": arr(record.anchor, np.int32),
            "cand_ids": arr(record.cand_ids, np.int32),
            "q": arr(record.q, np.float32),
            "p": arr(record.p, np.float32),
            "verifier_top1": arr(record.verifier_top1, np.int32),
            "verifier_top1_prob": arr(record.verifier_top1_prob, np.float32),
            "u": arr(record.u, np.float64),
            "base_choice": arr(record.base_choice, np.int16),
            "head_choice": arr(record.head_choice, np.int16),
            "head_block": arr(record.head_block, np.int16),
            "accept_len": arr(record.accept_len, np.int16),
        }
        for name, value in (("base_logp", record.base_logp), ("head_logp", record.head_logp)):
            if value is not None:  # NaN is stored as null: not scored
                columns[name] = arr(value, np.float64)
        self.write(columns)


def log_verified(
    logger: BlockLogger,
    state: ISDState,
    result: StepResult,
    logits: Tensor,
    temperature: float,
    alt_logp: Tensor | None = None,
    *,
    scored: bool = False,
    eos_token_id: int | None = None,
) -> None:
    """The block-log rows of one round's verifying rows: ``state`` is the state the round
    started from, ``logits [B, S, V]`` its forward's. With ``scored`` (:attr:`ISDOptions.
    score_blocks`) the base and head blocks get their whole-block log-likelihoods
    (:func:`block_logp`); ``alt_logp [B, M]`` holds the per-position scores of the other
    block where it differs from the drafted one (None: it nowhere does)."""
    rows = result.verified.nonzero()[:, 0]
    if not len(rows):
        return
    M = result.verified_draft.tokens.shape[1]
    draft = result.verified_draft.select(rows)
    base_logp = head_logp = None
    if scored and draft.alt_tokens is not None:
        own = token_logp(logits[rows, :M], draft.tokens)
        other_pos = alt_logp[rows] if alt_logp is not None else None
        actual = block_logp(draft.tokens, own, eos_token_id)
        other = block_logp(draft.alt_tokens, own, eos_token_id, draft.tokens, other_pos)
        base_logp, head_logp = (other, actual) if draft.head_drafted else (actual, other)
    logger.log_round(
        BlockRecord.from_round(
            request_id=state.request[rows],
            block_index=state.block_index[rows],
            draft=draft,
            verifier_logits=logits[rows, : M + 1],
            temperature=temperature,
            u=result.u[rows, 1 : 1 + M],
            accept_len=result.accept_len[rows],
            base_logp=base_logp,
            head_logp=head_logp,
        ),
        draft,
    )


def token_logp(logits: Tensor, blocks: Tensor) -> Tensor:
    """log p(x_i | ·) at temperature 1, ``[n, M]`` float64, from logits ``[n, M, V]``."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(-1, blocks[..., None])[..., 0]


def block_logp(
    block: Tensor,
    own: Tensor,
    eos_token_id: int | None,
    scored_block: Tensor | None = None,
    scored_own: Tensor | None = None,
) -> Tensor:
    """L(b | c) = Σ_{i ≤ e} log p(x_i | c, x_<i) (eq:mech_block_logp), ``[n]``, where e is the
    block's first EOS (or M): tokens after EOS are not part of the sequence, so two blocks
    that agree up to and including their EOS are the same block and score the same.

    ``own [n, M]`` are per-position scores of ``block`` itself; to score another block, pass
    the block that was scored (``scored_block``, with ``own`` its scores) and the new block's
    own per-position scores where they were computed (``scored_own``, NaN or None elsewhere):
    up to the first position where the two blocks differ their conditionals are the same
    numbers, which are taken from ``own``, so identical blocks get bitwise-identical scores.
    """
    M = block.shape[1]
    pos = torch.arange(M, device=block.device)
    logp = own
    if scored_block is not None:
        differs = block != scored_block
        first = torch.where(differs.any(1), differs.long().argmax(1), M)
        tail = scored_own if scored_own is not None else torch.full_like(own, float("nan"))
        logp = torch.where(pos[None] < first[:, None], own, tail)
    keep = torch.ones_like(block, dtype=torch.bool)
    if eos_token_id is not None:
        eos = block == eos_token_id
        end = torch.where(eos.any(1), eos.long().argmax(1), M - 1)
        keep = pos[None] <= end[:, None]
    return torch.where(keep, logp, 0.0).sum(-1)
