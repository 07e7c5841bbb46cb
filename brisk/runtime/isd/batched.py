"""ISD as state + pure functions of tensors: one verify round (or cold start) for a whole batch.

Stride N, M = N − 1. Every request of the batch is a row of :class:`ISDState` (``[B]`` and
``[B, …]`` tensors). A round feeds each row ``[pending, x_1..x_M, MASK×M]`` (verify round, 2N − 1
slots) or ``[pending, MASK×M]`` (cold start; padded to 2N − 1 when other rows verify), runs one
forward (the caller's: brisk's loop, the SGLang worker or a CUDA graph), and :func:`step` turns
the logits and last hidden states into the next state and each row's committed tokens (the
caller appends them, stops a request at its EOS or budget and keeps the statistics):

- **verify round** (the logit at slot t predicts the token after slot t): slots 0..M−1 give
  p_1..p_M for the drafts, slot M the bonus row p_{M+1}; accept x_i iff u_i · π_i(x_i) < p_i(x_i)
  (greedy: iff x_i = argmax p_i), L = leading acceptances. L = M commits x_1..x_M and a bonus token
  from p_{M+1}; L < M commits x_1..x_L and a correction from normalize([p_{L+1} − π_{L+1}]₊) and
  the next forward is a cold start. The committed tokens are distributed exactly as
  autoregressive sampling from p (paper, sec:idlm_background), and these are the gains and
  costs of the ISD cost model (eq:idlm_tpf_instantiation).
- **prefill** (:func:`first_step`): the forward over the whole prompt; its last logits give the
  first output token (a draw from p with the uniform at slot ``next`` of the request's counter 0),
  committed, and the next forward is a cold start from it. This is SGLang's round boundary: its
  prefill samples the first token too, so the server and brisk's loop run the same forwards.
- **cold start**: slot 0 gives the next token (a draw from p), committed.
- **proposal**: the next block comes from the row's M MASK slots (slots 1..M after a cold start,
  M+1..2M after a full acceptance): x_j drawn from q_j restricted to its Top-K candidates C_j
  (π_j is that restricted law; greedy: the argmax), or chosen by the corrector over C_j, left to
  right, with π_j its softmax (eq:head_residual_logits).

Both branches are computed for every row and merged with ``torch.where``: no per-row Python, no
host synchronization, fixed shapes for a given (B, S). Every uniform is
:func:`brisk.runtime.sampling.counter_uniforms` of (seed, request, the request's forward counter,
slot), so a row's output does not depend on the batch or the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.backbone import Backbone
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.sampling import Slots, counter_uniforms, sample_inverse_cdf

__all__ = [
    "Draft",
    "ISDState",
    "StepContext",
    "StepResult",
    "candidate_q",
    "first_step",
    "init_state",
    "step",
]


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
    """What a step needs beyond the state: options, K, and the head."""

    options: ISDOptions
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


def _float(x: Tensor) -> Tensor:
    return x if x.dtype == torch.float64 else x.float()


def probs_at(logits: Tensor, temperature: float) -> Tensor:
    """p or q at the decoding temperature (T = 1 when greedy: logs only)."""
    return torch.softmax(_float(logits) / (temperature if temperature > 0 else 1.0), dim=-1)


def candidate_q(logits: Tensor, cand_logits: Tensor, temperature: float) -> Tensor:
    """q_i(C_i) for the block log: the proposal law at the decoding temperature (T = 1 when
    greedy) at the candidates' logits ``cand_logits [..., K]``, normalized over the whole
    vocabulary of ``logits [..., V]``."""
    t = temperature if temperature > 0 else 1.0
    return torch.exp(_float(cand_logits) / t - (_float(logits) / t).logsumexp(-1, True))


def draw_next(logits: Tensor, temperature: float, u: Tensor) -> Tensor:
    """The next token from one row of logits ``[B, V]``: argmax, or a draw from p."""
    if temperature == 0:
        return logits.argmax(-1)
    return sample_inverse_cdf(probs_at(logits, temperature), u)


def verify_block(
    logits: Tensor, draft: Draft, temperature: float, u_accept: Tensor, u_next: Tensor
) -> tuple[Tensor, Tensor]:
    """Accept length L ``[B]`` and next token ``[B]`` of each row's draft: exact chain
    verification, the verify round of the module docstring, from the logits ``[B, M+1, V]``
    (p_1..p_M, then the bonus row p_{M+1}) with the acceptance uniforms ``u_accept [B, M]`` and
    the correction's (or bonus token's) uniform ``u_next [B]``. The one verifier: :func:`step`
    runs it, for brisk's decode loop and the server alike.

    π_i is ``draft.law [B, M, K]`` over ``draft.cand_ids [B, M, K]`` (zero outside them), read
    at ``draft.ranks``: the law x_i was drawn from, so it gives x_i positive mass. It may be q
    restricted to its Top-K, the corrector's softmax over its candidates in any order, a one-hot
    for an argmax draft (acceptance is then u < p_i(x_i) and the correction excludes x_i), or,
    with K = V, any full law; it is never expanded beyond the one row of the first rejection.
    """
    if draft.tokens.ndim != 2:
        raise ValueError(f"draft.tokens: expected shape [B, M], got {tuple(draft.tokens.shape)}")
    B, M = draft.tokens.shape
    # Shapes only: they are known on the host, so checking them costs no device synchronization.
    for name, shape, leading in (
        ("logits", logits.shape, (B, M + 1, logits.shape[-1])),
        ("draft.ranks", draft.ranks.shape, (B, M)),
        ("draft.cand_ids", draft.cand_ids.shape, (B, M, draft.cand_ids.shape[-1])),
        ("draft.law", draft.law.shape, draft.cand_ids.shape),
        ("u_accept", u_accept.shape, (B, M)),
        ("u_next", u_next.shape, (B,)),
    ):
        if tuple(shape) != tuple(leading):
            raise ValueError(f"{name}: expected shape {tuple(leading)}, got {tuple(shape)}")
    rows = torch.arange(B, device=logits.device)
    if temperature == 0:  # argmax p is the argmax of the logits: no softmax over the vocabulary
        top = logits.argmax(-1)
        L = (draft.tokens == top[:, :M]).long().cumprod(-1).sum(-1)
        return L, top[rows, L]
    p = probs_at(logits, temperature)  # [B, M+1, V]
    p_x = p[:, :M].gather(-1, draft.tokens[..., None])[..., 0]  # p_i(x_i)
    pi_x = draft.law.to(p.dtype).gather(-1, draft.ranks[..., None])[..., 0]  # π_i(x_i)
    accepted = u_accept.to(p.dtype) * pi_x < p_x  # P(accept) = min(1, p/π)
    L = accepted.long().cumprod(-1).sum(-1)
    # [p − π]₊ at the first rejection; π is zero at the bonus row L = M.
    target = p[rows, L]  # [B, V]
    at = L.clamp(max=M - 1)
    pi_row = torch.zeros_like(target).scatter_add_(
        -1, draft.cand_ids[rows, at], draft.law.to(p.dtype)[rows, at]
    ) * (L < M)[:, None].to(p.dtype)
    residual = (target - pi_row).clamp(min=0)
    # p = π exactly would make rejection impossible; rounding can still leave an all-zero
    # residual, and then p is the right fallback (it is the law the residual approximates).
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target)
    return L, sample_inverse_cdf(residual, u_next)


def propose(
    mask_logits: Tensor,
    mask_hidden: Tensor,
    anchor_hidden: Tensor,
    anchor: Tensor,
    offset: Tensor,
    u: Tensor,
    ctx: StepContext,
) -> Draft:
    """The next block from the M MASK slots: logits ``[B, M, V]``, hidden ``[B, M, H]``,
    anchor hidden ``[B, H]`` (the slot that produced x_0), anchor x_0 ``[B]``, uniforms
    ``[B, M]`` (one per position: the base and the head share it, so equal laws choose alike).
    """
    T, K = ctx.options.temperature, ctx.K
    cand_logits, cand_ids = mask_logits.topk(K, dim=-1)  # [B, M, K] descending
    if T == 0:  # the argmax: rank 0, π a point mass
        base_rank = torch.zeros_like(cand_ids[..., 0])
        base_law = torch.nn.functional.one_hot(base_rank, K).to(_float(cand_logits).dtype)
    else:  # q restricted to C_i and renormalized
        base_law = probs_at(cand_logits, T)
        base_rank = sample_inverse_cdf(base_law, u)
    none = torch.full_like(base_rank, -1)
    head, shadow = ctx.corrector, ctx.options.shadow
    head_drafted = head is not None and not shadow
    alt: Tensor | None = None
    if head is not None and not shadow:
        assert ctx.backbone is not None
        sel = head.select(
            ctx.backbone,
            anchor_hidden,
            anchor,
            mask_hidden,
            cand_logits,
            cand_ids,
            T,
            u=u if T > 0 else None,
        )
        ranks, law = sel.ranks, sel.probs
        head_choice = head_block = ranks
        alt = cand_ids.gather(-1, base_rank[..., None])[..., 0]  # the base's whole block
    else:
        ranks, law, head_choice, head_block = base_rank, base_law, none, none
        if head is not None and ctx.log:  # shadow: the head beside the base, for the logs
            assert ctx.backbone is not None
            tokens = cand_ids.gather(-1, ranks[..., None])[..., 0]
            refined = head(
                ctx.backbone, anchor_hidden, anchor, mask_hidden, cand_logits, cand_ids, tokens
            )
            head_choice = (
                refined.argmax(-1) if T == 0 else sample_inverse_cdf(probs_at(refined, T), u)
            )
            free = head.select(
                ctx.backbone,
                anchor_hidden,
                anchor,
                mask_hidden,
                cand_logits,
                cand_ids,
                T,
                u=u if T > 0 else None,
            )
            head_block, alt = free.ranks, free.tokens
    if T == 0 and head_drafted:
        law = torch.nn.functional.one_hot(ranks, K).to(base_law.dtype)
    kept = (anchor_hidden, mask_hidden, cand_logits) if ctx.collect else (None, None, None)
    q = candidate_q(mask_logits, cand_logits, T) if ctx.log else None
    return Draft(
        tokens=cand_ids.gather(-1, ranks[..., None])[..., 0],
        ranks=ranks,
        cand_ids=cand_ids,
        law=law,
        anchor=anchor,
        offset=offset,
        base_choice=base_rank,
        head_choice=head_choice,
        head_block=head_block,
        q=q,
        alt_tokens=alt,
        head_drafted=head_drafted,
        anchor_hidden=kept[0],
        mask_hidden=kept[1],
        cand_logits=kept[2],
    )


def first_step(
    logits: Tensor,
    lengths: Tensor,
    seeds: Tensor,
    requests: Tensor,
    ctx: StepContext,
    counter: Tensor | None = None,
    u: Tensor | None = None,
) -> StepResult:
    """The prefill's transition: the first token of each row from the logits ``[B, V]`` at its
    prompt's last position (argmax, or a draw from p with the uniform at slot ``next``), and
    rows that cold-start from it next. ``lengths [B]``: the prompts' lengths; ``counter [B]``:
    the forwards the requests have run (default 0; a re-prefilled request resumes past every
    uniform it used), the prefill's uniforms ``u [B, 2M + 1]`` as in :func:`step`.

    The caller runs the forward and keeps the whole prompt's KV (``keep`` is empty); the result
    commits one token per row like a cold start, so the prefill counts as a forward.
    """
    device = logits.device
    B = logits.shape[0]
    seeds, requests = seeds.to(device), requests.to(device)
    counter = torch.zeros_like(seeds) if counter is None else counter.to(device)
    u = ctx.uniforms(seeds, requests, counter) if u is None else u.to(device)
    first = draw_next(logits, ctx.options.temperature, u[:, Slots(ctx.M).next])
    state = init_state(first, lengths.to(device) + 1, seeds, requests, ctx, counter + 1)
    tokens = torch.zeros(B, ctx.M + 1, dtype=torch.long, device=device)
    tokens[:, 0] = first
    none = torch.zeros(B, dtype=torch.bool, device=device)
    return StepResult(
        state,
        tokens,
        torch.ones_like(first),
        torch.full_like(first, -1),
        torch.zeros(B, 0, dtype=torch.bool, device=device),
        none,
        state.draft,
        u,
    )


def step(
    state: ISDState, logits: Tensor, hidden: Tensor, ctx: StepContext, u: Tensor | None = None
) -> StepResult:
    """One round for every row from the forward's ``logits [B, S, V]`` and ``hidden [B, S, H]``,
    S = 2M + 1 (some row verifies) or M + 1 (all rows cold-start): a pure transition, the next
    state and what each row committed. The caller owns the requests: it appends the committed
    tokens, stops a request at its EOS or budget (and drops its row) and keeps statistics.

    ``u [B, 2M + 1]`` are the round's uniforms when the caller has them at hand (a table of
    :func:`~brisk.runtime.sampling.counter_uniforms` precomputed for the run); they must equal
    ``ctx.uniforms(state.seed, state.request, state.counter)`` (zeros where greedy decoding
    without a log reads none).
    """
    M, opt = ctx.M, ctx.options
    B, S, _ = logits.shape
    device = logits.device
    slots = Slots(M)
    ar = torch.arange(B, device=device)
    ver = state.verify
    if u is None:
        u = ctx.uniforms(state.seed, state.request, state.counter)
    u_next, u_accept, u_draft = u[:, slots.next], u[:, 1 : 1 + M], u[:, 1 + M :]

    # Verify rounds and cold starts, both for every row, merged by phase.
    nxt = draw_next(logits[:, 0], opt.temperature, u_next)
    L = torch.zeros(B, dtype=torch.long, device=device)
    if S == 2 * M + 1:
        L_v, nxt_v = verify_block(
            logits[:, : M + 1], state.draft, opt.temperature, u_accept, u_next
        )
        L, nxt = torch.where(ver, L_v, L), torch.where(ver, nxt_v, nxt)

    # Commit x_1..x_L and the next token (cold start: the next token alone).
    count = L + 1
    tokens = torch.cat([state.draft.tokens, nxt[:, None]], 1).scatter(1, L[:, None], nxt[:, None])
    length = state.length + count

    # The next block, from this forward's MASK slots, for rows that verify next (all but the
    # rejections, which cold-start).
    drafting = ~ver | (L == M)
    first_mask = torch.where(ver, M + 1, 1) if S == 2 * M + 1 else torch.ones_like(L)
    span = first_mask[:, None] + torch.arange(M, device=device)  # [B, M]
    draft = propose(
        logits[ar[:, None], span],
        hidden[ar[:, None], span],
        hidden[ar, first_mask - 1],
        nxt,
        length,
        u_draft,
        ctx,
    )

    keep = torch.arange(S, device=device) <= torch.where(ver, L, 0)[:, None]
    new_state = ISDState(
        seed=state.seed,
        request=state.request,
        counter=state.counter + 1,
        pending=nxt,
        verify=drafting,
        length=length,
        block_index=state.block_index + ver.long(),
        draft=draft,
    )
    return StepResult(new_state, tokens, count, torch.where(ver, L, -1), keep, ver, state.draft, u)
