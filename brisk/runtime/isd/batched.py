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
slot), so a row's output does not depend on the batch or the device. The rows' types are
:mod:`brisk.runtime.isd.state`'s (re-exported here); every draft, ISD's and the speculative
loop's, is made by :func:`build_draft`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from brisk.runtime.corrector import CorrectorInputs
from brisk.runtime.isd.state import Draft, ISDState, StepContext, StepResult, init_state
from brisk.runtime.sampling import Slots, sample_inverse_cdf

__all__ = [
    "Draft",
    "ISDState",
    "StepContext",
    "StepResult",
    "build_draft",
    "candidate_q",
    "draw_next",
    "first_step",
    "init_state",
    "propose",
    "step",
    "verify_block",
]


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


def build_draft(
    ranks: Tensor,
    cand_ids: Tensor,
    law: Tensor,
    anchor: Tensor,
    offset: Tensor,
    logits: Tensor,
    cand_logits: Tensor,
    anchor_hidden: Tensor,
    mask_hidden: Tensor,
    ctx: StepContext,
    *,
    base_choice: Tensor | None = None,
    head_choice: Tensor | None = None,
    head_block: Tensor | None = None,
    alt_tokens: Tensor | None = None,
    head_drafted: bool = False,
) -> Draft:
    """The :class:`Draft` of ``ranks [B, M]`` among the candidates ``cand_ids [B, M, K]``,
    drawn from ``law [B, M, K]``, after the anchor x_0 ``[B]`` at ``offset [B]``: the one way a
    draft is made (ISD's :func:`propose`, the speculative loop's own laws). ``logits [B, M, V]``
    and ``cand_logits [B, M, K]`` give the block log's q when ``ctx.log``; the head's inputs
    (``anchor_hidden [B, H]``, ``mask_hidden [B, M, H]``, ``cand_logits``) are kept when
    ``ctx.collect``. The base's choice defaults to ``ranks`` and the head's to −1 (not run)."""
    none = torch.full_like(ranks, -1)
    kept = (anchor_hidden, mask_hidden, cand_logits) if ctx.collect else (None, None, None)
    return Draft(
        tokens=cand_ids.gather(-1, ranks[..., None])[..., 0],
        ranks=ranks,
        cand_ids=cand_ids,
        law=law,
        anchor=anchor,
        offset=offset,
        base_choice=ranks if base_choice is None else base_choice,
        head_choice=none if head_choice is None else head_choice,
        head_block=none if head_block is None else head_block,
        q=candidate_q(logits, cand_logits, ctx.options.temperature) if ctx.log else None,
        alt_tokens=alt_tokens,
        head_drafted=head_drafted,
        anchor_hidden=kept[0],
        mask_hidden=kept[1],
        cand_logits=kept[2],
    )


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
    head, shadow = ctx.corrector, ctx.options.shadow
    head_drafted = head is not None and not shadow
    block = CorrectorInputs(
        anchor_hidden, anchor, mask_hidden, cand_logits, cand_ids, u=u if T > 0 else None
    )

    def free_block() -> Any:  # the head's own block, free-running over C_i
        assert head is not None
        assert ctx.backbone is not None
        return head.select(ctx.backbone, block, T)

    ranks, law = base_rank, base_law
    head_choice: Tensor | None = None
    head_ranks: Tensor | None = None
    alt: Tensor | None = None
    if head_drafted:
        sel = free_block()
        ranks, law = sel.ranks, sel.probs
        head_choice = head_ranks = ranks
        alt = cand_ids.gather(-1, base_rank[..., None])[..., 0]  # the base's whole block
    elif head is not None and ctx.log:  # shadow: the head beside the base, for the logs
        assert ctx.backbone is not None
        tokens = cand_ids.gather(-1, ranks[..., None])[..., 0]
        refined = head(ctx.backbone, block, tokens)
        head_choice = refined.argmax(-1) if T == 0 else sample_inverse_cdf(probs_at(refined, T), u)
        free = free_block()
        head_ranks, alt = free.ranks, free.tokens
    if T == 0 and head_drafted:
        law = torch.nn.functional.one_hot(ranks, K).to(base_law.dtype)
    return build_draft(
        ranks,
        cand_ids,
        law,
        anchor,
        offset,
        mask_logits,
        cand_logits,
        anchor_hidden,
        mask_hidden,
        ctx,
        base_choice=base_rank,
        head_choice=head_choice,
        head_block=head_ranks,
        alt_tokens=alt,
        head_drafted=head_drafted,
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
