"""The single-request ISD loop, written to be read: the twin the batched step is tested against.

Like gpt-fast's ``speculative_decode``: one request, Python ints, one forward per round on a
dense KV cache, verification by :func:`brisk.runtime.verify.verify_chain`. It draws the same
uniforms (same seed, request id, forward counter and :class:`~brisk.runtime.sampling.Slots`) and
proposes with the same per-position function as :func:`brisk.runtime.isd.batched.step`, so for any
request its tokens, accept lengths and forward count equal the batched loop's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from brisk.runtime.backbone import Backbone
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd.batched import Draft, StepContext, draw_next, probs_at, propose
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.result import RequestOutput
from brisk.runtime.sampling import Slots, counter_uniforms
from brisk.runtime.verify import ProposalLaw, verify_chain

__all__ = ["reference_decode"]


@torch.inference_mode()
def reference_decode(
    backbone: Backbone,
    prompt: Sequence[int],
    options: ISDOptions,
    *,
    corrector: Corrector | None = None,
    seed: int = 0,
    request_id: int = 0,
) -> RequestOutput:
    M, T, mask = options.M, options.temperature, backbone.mask_token_id
    K = corrector.config.K if corrector is not None else min(options.top_k, backbone.vocab_size)
    ctx = StepContext(options, K, backbone, corrector)
    slots, out = Slots(M), RequestOutput()
    cache = backbone.new_cache()
    if len(prompt) > 1:
        backbone.forward(torch.tensor([list(prompt[:-1])]), cache)
    pending, draft = prompt[-1], None  # draft: the block to verify (None → cold start)
    while not out.finished:
        u = counter_uniforms(*(torch.tensor([x]) for x in (seed, request_id, out.forwards)),
                             slots.width)[0]  # fmt: skip
        length = backbone.cache_length(cache)
        block = [] if draft is None else draft.tokens[0].tolist()
        fwd = backbone.forward(torch.tensor([[pending, *block, *[mask] * M]]), cache)
        logits, hidden = fwd.logits[0], fwd.hidden[0]
        out.forwards += 1
        if draft is None:  # cold start: slot 0 gives the next token, slots 1..M the proposals
            committed = [int(draw_next(logits[:1], T, u[slots.next : slots.next + 1])[0])]
            first, full = 1, True
        else:  # verify round: p_1..p_M for the drafts, p_{M+1} for the bonus token
            law = ProposalLaw.point_mass() if T == 0 else ProposalLaw.candidates(
                draft.law, draft.cand_ids)  # fmt: skip
            res = verify_chain(probs_at(logits[None, : M + 1], T), draft.tokens, law,
                               greedy=T == 0, u=u[None, 1 : 1 + M], u_next=u[:1])  # fmt: skip
            L = int(res.accept_len[0])
            out.accept_lengths.append(L)
            committed = [*block[:L], int(res.next_token[0])]
            first, full = M + 1, L == M
        backbone.trim(cache, length + len(committed))  # keep pending and the accepted drafts
        out.committed += len(committed)
        for t in committed:  # cut at EOS (kept) or at the token budget
            out.tokens.append(t)
            if t == options.eos_token_id:
                out.finished = "eos"
            elif len(out.tokens) >= options.max_new_tokens:
                out.finished = "length"
            if out.finished:
                break
        pending = committed[-1]
        draft = None
        if full and not out.finished:  # the MASK slots propose the next block
            span = slice(first, first + M)
            draft = _propose(logits[span], hidden[span], hidden[first - 1], pending,
                             u[1 + M :], ctx)  # fmt: skip
    return out


def _propose(logits, hidden, anchor_hidden, anchor, u, ctx) -> Draft:  # type: ignore[no-untyped-def]
    return propose(logits[None], hidden[None], anchor_hidden[None], torch.tensor([anchor]),
                   torch.zeros(1, dtype=torch.long), u[None], ctx)  # fmt: skip
