"""What ISD's batched step works on: a batch's rows as dataclasses of ``[B, …]`` tensors.

- :class:`Draft` — the block each row proposed and what verification and the block log need
  about it (made by :func:`brisk.runtime.isd.batched.build_draft`);
- :class:`ISDState` — what a row carries from one forward to the next;
- :class:`StepContext` — what a step needs beyond the state: the options, K and the head;
- :class:`StepResult` — one round's transition.

Rows are selected and concatenated field by field (``select``, ``concat``), so a loop or a
server keeps any subset of its requests in one state. The transitions themselves are
:mod:`brisk.runtime.isd.batched`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from brisk.runtime.sampling import Slots, counter_uniforms

if TYPE_CHECKING:
    from brisk.runtime.backbone import Backbone
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.decode_options import DecodeOptions

__all__ = ["Draft", "ISDState", "StepContext", "StepResult", "init_state"]


class _Rows:
    """Row selection for dataclasses whose fields are all ``[B, …]`` tensors (or None)."""

    def select(self, index: Tensor) -> Any:
        values = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, _Rows):
                value = value.select(index)
            elif isinstance(value, Tensor):
                value = value[index]
            values[f.name] = value
        return type(self)(**values)

    def rows(self) -> int:
        """B: the length of the first tensor field."""
        return next(
            int(v.shape[0])
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if isinstance(v := getattr(self, f.name), Tensor)
        )

    @classmethod
    def concat(cls, parts: Sequence[Any]) -> Any:
        """Batches into one, rows in order (the inverse of :meth:`select`). An optional field
        that some parts hold and others lack (None) is zero-filled for the lacking parts' rows;
        boolean flags are or-ed."""
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            column = [getattr(p, f.name) for p in parts]
            value = column[0]
            if isinstance(value, _Rows):
                value = type(value).concat(column)
            elif any(isinstance(v, Tensor) for v in column):
                like = next(v for v in column if isinstance(v, Tensor))
                value = torch.cat(
                    [
                        v if isinstance(v, Tensor) else like.new_zeros((p.rows(), *like.shape[1:]))
                        for v, p in zip(column, parts, strict=True)
                    ]
                )
            elif isinstance(value, bool):
                value = any(column)
            values[f.name] = value
        return cls(**values)


@dataclass(frozen=True)
class Draft(_Rows):
    """The block each row proposed, and what verification and the block log need about it."""

    tokens: Tensor  # [B, M] x_1..x_M
    ranks: Tensor  # [B, M] index of x_i in C_i
    cand_ids: Tensor  # [B, M, K] C_i, Top-K of q_i by base logit, descending
    law: Tensor  # [B, M, K] π_i over C_i: the law x_i was drawn from (one-hot when greedy)
    anchor: Tensor  # [B] x_0, the committed token before the block
    offset: Tensor  # [B] index of x_1 in the request's sequence (prompt + output)
    base_choice: Tensor  # [B, M] rank the base selector took (at the head's state, head-on)
    head_choice: Tensor  # [B, M] rank the head took at the block's prefix (−1: head not run)
    head_block: Tensor  # [B, M] ranks of the head's own free-running block (−1: not run)
    q: Tensor | None = None  # [B, M, K] q_i(C_i), full-vocab normalized (logs only)
    alt_tokens: Tensor | None = None  # [B, M] the other selector's whole block (ΔL scoring)
    head_drafted: bool = False  # the head chose ``tokens`` (else the base did)
    # What the head's forward needs, kept only when collecting corrector training events:
    anchor_hidden: Tensor | None = None  # [B, H] hidden state of the slot that produced x_0
    mask_hidden: Tensor | None = None  # [B, M, H] hidden states of the MASK slots
    cand_logits: Tensor | None = None  # [B, M, K] base logits of C_i, descending


@dataclass(frozen=True)
class ISDState(_Rows):
    """Everything a row carries from one forward to the next: what the next forward feeds and
    how its uniforms are keyed. What a request has output so far belongs to the loop that owns
    it (:mod:`brisk.runtime.isd.outputs` for brisk's decode, SGLang's request for the server)."""

    seed: Tensor  # [B] int64
    request: Tensor  # [B] int64 request id
    counter: Tensor  # [B] int64 forwards this request has run: its own round counter
    pending: Tensor  # [B] last committed token, fed at slot 0 of the next forward
    verify: Tensor  # [B] bool: the next forward verifies ``draft`` (else a cold start)
    length: Tensor  # [B] tokens of the request's sequence so far (prompt + committed)
    block_index: Tensor  # [B] verify rounds so far (the block log's block index)
    draft: Draft


@dataclass(frozen=True)
class StepContext:
    """What a step needs beyond the state: the options (their stride, temperature and
    ``shadow``), K, and the head."""

    options: DecodeOptions
    K: int
    backbone: Backbone | None = None
    corrector: Corrector | None = None
    log: bool = False  # fill the logs-only fields of the draft
    collect: bool = False  # keep the head's inputs on the draft (corrector training events)

    @property
    def M(self) -> int:
        return self.options.M

    @property
    def needs_uniforms(self) -> bool:
        """Whether a round reads its uniforms: sampling does, greedy decoding only for the
        block log (which records them); greedy without a log skips the hash."""
        return self.options.temperature > 0 or self.log

    def uniforms(self, seed: Tensor, request: Tensor, counter: Tensor) -> Tensor:
        """The round's uniforms ``[B, 2M + 1]`` (:func:`counter_uniforms`), or zeros where
        nothing reads them (:attr:`needs_uniforms`)."""
        width = Slots(self.M).width
        if not self.needs_uniforms:
            return torch.zeros(len(seed), width, dtype=torch.float64, device=seed.device)
        return counter_uniforms(seed, request, counter, width)


@dataclass(frozen=True)
class StepResult:
    """One round's transition: the next state and, per row, what the round committed."""

    state: ISDState
    tokens: Tensor  # [B, M + 1] committed tokens x_1..x_L, then the next token (beyond count: junk)
    count: Tensor  # [B] tokens committed, L + 1 (cold start, prefill: 1)
    accept_len: Tensor  # [B] L of verifying rows, −1 for cold starts (and the prefill)
    keep: Tensor  # [B, S] new slots each row keeps (their KV stays valid; prefill: [B, 0])
    verified: Tensor  # [B] bool: the row ran a verify round
    verified_draft: Draft  # the draft that was verified (the block log's row)
    u: Tensor  # [B, 2M + 1] this round's uniforms (Slots layout)

    def committed(self) -> list[list[int]]:
        """Each row's committed tokens as lists (one host transfer)."""
        tokens, count = self.tokens.tolist(), self.count.tolist()
        return [row[:n] for row, n in zip(tokens, count, strict=True)]


def init_state(
    last_tokens: Tensor,
    lengths: Tensor,
    seeds: Tensor,
    requests: Tensor,
    ctx: StepContext,
    counter: Tensor | None = None,
) -> ISDState:
    """Rows that cold-start next from their sequence's last token ``last_tokens [B]``;
    ``lengths [B]`` are the sequences' lengths (prompt and everything committed, that token
    included), ``counter [B]`` the forwards each request has run (default 0)."""
    B, M, K = len(last_tokens), ctx.M, ctx.K
    device = last_tokens.device

    def zeros(*shape: int, dtype: torch.dtype = torch.long, fill: float = 0) -> Tensor:
        return torch.full(shape, fill, dtype=dtype, device=device)

    draft = Draft(
        tokens=zeros(B, M),
        ranks=zeros(B, M),
        cand_ids=zeros(B, M, K),
        law=zeros(B, M, K, dtype=torch.float32, fill=1.0),
        anchor=zeros(B),
        offset=zeros(B),
        base_choice=zeros(B, M),
        head_choice=zeros(B, M, fill=-1),
        head_block=zeros(B, M, fill=-1),
    )
    return ISDState(
        seed=seeds.to(device=device, dtype=torch.long),
        request=requests.to(device=device, dtype=torch.long),
        counter=zeros(B) if counter is None else counter.to(device=device, dtype=torch.long),
        pending=last_tokens.to(torch.long),
        verify=zeros(B, dtype=torch.bool),
        length=lengths.to(device=device, dtype=torch.long),
        block_index=zeros(B),
        draft=draft,
    )
