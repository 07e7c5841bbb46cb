"""Speculative decoding with a block drafter and an autoregressive target, verified exactly.

Per round (paper, sec:background, the drafter family; SD cost model g_k = k + 1, c_k = 1 + ρ):

1. the drafter runs once on ``[x_0, MASK × M]`` (x_0 the last committed token, at position s)
   against the target features of every committed position, and proposes x_1..x_M from its
   law π through the target's LM head: the argmax (``greedy``), a draw from its softmax at the
   decoding temperature (``sample``), or from that softmax restricted to its Top-K (``top-k``);
2. the target runs once on ``[x_0, x_1..x_M]``; its logits give p_1..p_M and the bonus row
   p_{M+1}, and :func:`brisk.runtime.isd.batched.verify_block` (the one verifier, ISD's) accepts
   the leading x_i with probability min(1, p_i(x_i)/π_i(x_i)) and draws the correction from
   normalize([p_{L+1} − π_{L+1}]₊) or the bonus from p_{M+1}: the output is distributed exactly
   as the target's own sampling (greedy: equal to its greedy decoding, token for token);
3. the target's cache is cut back to the accepted prefix (x_0..x_L), and the target features of
   those L + 1 positions, taken from the verify forward, join the drafter's context.

Every uniform is :func:`~brisk.runtime.sampling.counter_uniforms` of (seed, request, round,
slot) in ISD's slot layout (:class:`~brisk.runtime.sampling.Slots`: the proposal's draws at
the ``draft`` slots, acceptance at ``accept``, the correction at ``next``), so a request's output
depends on its prompt, seed and id only. The prefill draws the first token like ISD's.

**The corrector on drafts.** With ``corrector`` (a :class:`~brisk.runtime.corrector.Corrector` of
M = B − 1 positions) the draft is the head's: C_i = the Top-K of the drafter's logits, and the
head picks over C_i left to right, each pick conditioned on the previous ones
(:meth:`~brisk.runtime.corrector.Corrector.select`: the argmax at T = 0, a draw from its π_i at
T > 0, which verification is then given). The head reads the drafter's hidden states at the MASK
slots, the target's E and E_out (:class:`~brisk.runtime.backbone.ModelHeads`), and for the anchor
its token's embedding with a *zero* hidden state: what SGLang's DFlash sampler sees
(:mod:`brisk.runtime.serving.dflash`), so one head serves both loops. A logger that collects
(:class:`~brisk.runtime.train.corrector.store.EventWriter`) gets the head's inputs of every round,
recorded the same way: the corrector's training events of this decoder.

Requests run one at a time (batch 1, the target's ``DynamicCache``); tokens per forward count
target forwards (the prefill's included), and the run measures the drafter's forward time
relative to the target's verify forward (ρ of the cost model).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from brisk.mechanism.schema import Verification
from brisk.runtime.backbone import ModelHeads, cache_keyword
from brisk.runtime.corrector import Corrector
from brisk.runtime.decode_options import Requests
from brisk.runtime.drafter.model import DFlashDrafter
from brisk.runtime.drafter.result import DRAFT_LAWS, DraftLaw, SDOptions, SDOutput, SDResult
from brisk.runtime.isd.batched import (
    Draft,
    StepContext,
    build_draft,
    draw_next,
    propose,
    verify_block,
)
from brisk.runtime.isd.blocklog import BlockLogger, BlockRecord
from brisk.runtime.sampling import Slots, counter_uniforms, sample_inverse_cdf

__all__ = [
    "DRAFT_LAWS",
    "DraftLaw",
    "SDOptions",
    "SDOutput",
    "SDResult",
    "check_head",
    "check_pair",
    "extend_kv",
    "position_limit",
    "speculative_decode",
    "target_heads",
    "verification_of",
]


def verification_of(options: SDOptions, head: Corrector | None = None) -> Verification:
    """How the loop verifies drafts of ``options`` (the block log's verification): against the
    head's law when a head drafts."""
    T = options.temperature
    laws = {"greedy": "argmax", "top-k": "q_topk", "sample": "q"}
    law = "head" if head is not None else "argmax" if T == 0 else laws[options.draft]
    if T == 0:
        return Verification("greedy", law, 1.0)  # type: ignore[arg-type]
    return Verification("sampled", law, T)  # type: ignore[arg-type]


def _isd_law(options: SDOptions, head: Corrector | None) -> bool:
    """Whether the draft law is one ISD's proposal step draws (greedy at T = 0, q restricted to
    the Top-K, the head's), so the loop proposes through it."""
    return head is not None or options.temperature == 0 or options.draft == "top-k"


def _candidates(target: Any, options: SDOptions, head: Corrector | None) -> int:
    """K: the head's candidates when it drafts, else ``top_k`` (at most the vocabulary)."""
    return head.config.K if head is not None else min(options.top_k, _vocab(target))


def check_head(target: Any, drafter: DFlashDrafter, head: Corrector, options: SDOptions) -> None:
    """That ``head`` can draft for ``drafter`` on ``target`` under ``options``: its M is the
    drafter's, its width and vocabulary the target's, and at T > 0 the drafts are Top-K draws
    (the head samples over the drafter's Top-K); one line naming the first that does not."""
    c, heads = head.config, target_heads(target)
    if c.M != drafter.spec.M:
        raise ValueError(
            f"corrector: a head for M = {c.M} positions; the drafter's block of "
            f"{drafter.spec.block_size} drafts M = {drafter.spec.M}"
        )
    if (c.hidden_size, c.vocab_size) != (heads.hidden_size, heads.vocab_size):
        raise ValueError(
            f"corrector: a head for hidden {c.hidden_size} / vocab {c.vocab_size}; the target "
            f"has {heads.hidden_size} / {heads.vocab_size}"
        )
    if heads.vocab_size < c.K:
        raise ValueError(
            f"corrector: K = {c.K} candidates exceed the vocabulary ({heads.vocab_size})"
        )
    if options.temperature > 0 and options.draft != "top-k":
        raise ValueError(
            f"draft: with a head at T > 0 the drafts are the head's draws over the drafter's "
            f"Top-K (draft 'top-k'), got {options.draft!r}"
        )


def _vocab(target: Any) -> int:
    return int(target.get_output_embeddings().weight.shape[0])


_heads: weakref.WeakKeyDictionary[Any, ModelHeads] = weakref.WeakKeyDictionary()


def target_heads(target: Any) -> ModelHeads:
    """The target's E and E_out as the head reads them, one object per target (the head's
    folded tables are cached against it, so a second decode does not fold them again)."""
    if target not in _heads:
        _heads[target] = ModelHeads(target, vocab_size=_vocab(target))
    return _heads[target]


def position_limit(target: Any, M: int) -> int | None:
    """The most prompt + new tokens a request may hold: the target's positions less a verify
    block of M + 1 (None: the config names no limit)."""
    limit = getattr(target.config, "max_position_embeddings", None)
    return None if limit is None else int(limit) - (M + 1)


def check_pair(target: Any, drafter: DFlashDrafter) -> None:
    """That ``drafter`` was built for ``target``: width, vocabulary, target layers (the ids it
    reads and the depth it was built for) and mask id; one line naming the first that does not
    match."""
    tc, spec = target.config, drafter.spec
    text = getattr(tc, "text_config", None) or tc  # a multimodal config keeps its LM here
    H, V, L = text.hidden_size, _vocab(target), text.num_hidden_layers
    if drafter.config.hidden_size != H:
        raise ValueError(f"drafter: hidden size {drafter.config.hidden_size}, the target's is {H}")
    if drafter.config.vocab_size != V:
        raise ValueError(f"drafter: vocabulary {drafter.config.vocab_size}, the target's is {V}")
    if max(spec.target_layer_ids) >= L - 1:
        raise ValueError(
            f"drafter: target_layer_ids {list(spec.target_layer_ids)} name layers the target "
            f"({L} layers) does not have below its last (whose output a server does not "
            "capture: ids must be at most L − 2)"
        )
    if spec.num_target_layers != L:
        raise ValueError(
            f"drafter: built for a target of {spec.num_target_layers} layers, the target has {L}"
        )
    if not 0 <= spec.mask_token_id < V:
        raise ValueError(f"drafter: mask_token_id {spec.mask_token_id} is outside the vocabulary")


def extend_kv(
    held: list[tuple[Tensor, Tensor]] | None, new: list[tuple[Tensor, Tensor]]
) -> list[tuple[Tensor, Tensor]]:
    """A drafter context's keys and values ``[B, kv_heads, C, d]`` per layer, with ``new``'s
    positions after ``held``'s (None: an empty context): how this loop and the server's
    drafter worker grow a request's context."""
    if held is None:
        return new
    return [
        (torch.cat([k0, k], 2), torch.cat([v0, v], 2))
        for (k0, v0), (k, v) in zip(held, new, strict=True)
    ]


class _Context:
    """The drafter's keys and values of every committed position (its cache)."""

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter = drafter
        self.kv: list[tuple[Tensor, Tensor]] | None = None

    def append(self, features: Tensor, start: int) -> None:
        positions = torch.arange(start, start + features.shape[1], device=features.device)[None]
        kv = self.drafter.context_kv(self.drafter.project(features), positions)
        self.kv = extend_kv(self.kv, kv)


def _propose(
    logits: Tensor,
    hidden: Tensor,
    anchor: Tensor,
    offset: int,
    options: SDOptions,
    u: Tensor,
    ctx: StepContext,
) -> Draft:
    """x_1..x_M from the drafter's logits ``[1, M, V]`` and hidden states ``[1, M, H]`` at the
    MASK slots, and the law π they were drawn from. Greedy drafts at T = 0, Top-K drafts and the
    head's are ISD's proposal step (:func:`brisk.runtime.isd.batched.propose`, with the anchor's
    hidden state zero as in SGLang's DFlash sampler); ``sample`` draws from the whole softmax,
    and ``greedy`` at T > 0 proposes the argmax as a point mass over the Top-K."""
    anchor_hidden = hidden.new_zeros(hidden.shape[0], hidden.shape[-1])
    offsets = torch.tensor([offset], device=logits.device)
    if _isd_law(options, ctx.corrector):
        return propose(logits, hidden, anchor_hidden, anchor, offsets, u, ctx)
    if options.draft == "sample":
        cand_ids = torch.arange(logits.shape[-1], device=logits.device).expand(logits.shape)
        law = torch.softmax(logits.double() / options.temperature, dim=-1)
        ranks = sample_inverse_cdf(law, u)
    else:  # greedy at T > 0
        cand_ids = logits.topk(ctx.K, dim=-1).indices
        ranks = torch.zeros_like(cand_ids[..., 0])
        law = torch.nn.functional.one_hot(ranks, cand_ids.shape[-1]).double()
    cand_logits = logits.gather(-1, cand_ids)
    return build_draft(
        ranks, cand_ids, law, anchor, offsets, logits, cand_logits, anchor_hidden, hidden, ctx
    )


def _decode_one(
    target: Any,
    drafter: DFlashDrafter,
    prompt: Sequence[int],
    options: SDOptions,
    seed: int,
    request: int,
    timing: list[float],
    logger: BlockLogger | None,
    ctx: StepContext,
) -> SDOutput:
    from transformers import DynamicCache

    spec, device = drafter.spec, next(drafter.parameters()).device
    M, T = spec.M, options.temperature
    slots = Slots(M)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    key = (torch.tensor([seed], device=device), torch.tensor([request], device=device))

    def uniforms(counter: int) -> Tensor:
        return counter_uniforms(*key, torch.tensor([counter], device=device), slots.width)

    out = SDOutput()
    cache = DynamicCache(config=target.config)
    kv = {cache_keyword(target): cache, "use_cache": True, "output_hidden_states": True}
    ids = torch.tensor([list(prompt)], device=device)
    pre = target(input_ids=ids, logits_to_keep=1, **kv)  # no [P, V] logits
    out.target_forwards = 1
    anchor = draw_next(pre.logits[:, -1], T, uniforms(0)[:, slots.next])
    context = _Context(drafter)
    context.append(drafter.features(pre.hidden_states), 0)
    start = len(prompt)  # the anchor's position
    out.tokens.append(int(anchor))
    counter = 1
    eos = options.eos_token_id
    ended = out.tokens[-1] == eos
    while len(out.tokens) < options.max_new_tokens and not ended:
        u = uniforms(counter)
        t0 = time.perf_counter()
        block = torch.full((1, M + 1), spec.mask_token_id, device=device)
        block[0, 0] = anchor
        positions = torch.arange(start, start + M + 1, device=device)[None]
        assert context.kv is not None
        hidden = drafter(embed(block), positions, context.kv)
        mask_hidden = hidden[:, 1:]
        draft = _propose(
            lm_head(mask_hidden), mask_hidden, anchor, start + 1, options, u[:, 1 + M :], ctx
        )
        t1 = time.perf_counter()
        verify_ids = torch.cat([anchor[:, None], draft.tokens], 1)
        ver = target(input_ids=verify_ids, **kv)
        L_t, nxt = verify_block(ver.logits, draft, T, u[:, 1 : 1 + M], u[:, slots.next])
        t2 = time.perf_counter()
        timing[0] += t1 - t0
        timing[1] += t2 - t1
        if logger is not None:
            record = BlockRecord.from_round(
                request_id=key[1],
                block_index=torch.tensor([counter - 1], device=device),
                draft=draft,
                verifier_logits=ver.logits,
                temperature=T,
                u=u[:, 1 : 1 + M],
                accept_len=L_t,
            )
            logger.log_round(record, draft)
        L = int(L_t)
        if L < M:  # x_0..x_L stay; x_{L+1}..x_M go (crop takes a negative count to drop)
            cache.crop(L - M)
        context.append(drafter.features(ver.hidden_states)[:, : L + 1], start)
        committed = [*draft.tokens[0, :L].tolist(), int(nxt)]
        out.tokens += committed
        ended = eos in committed  # an accepted draft may be the EOS: nothing after it counts
        out.accept_lengths.append(L)
        out.target_forwards += 1
        anchor, start, counter = nxt, start + L + 1, counter + 1
    if eos in out.tokens:
        out.tokens = out.tokens[: out.tokens.index(eos) + 1]
    out.tokens = out.tokens[: options.max_new_tokens]
    out.finished = "eos" if out.tokens[-1] == eos else "length"
    return out


def speculative_decode(
    target: Any,
    drafter: DFlashDrafter,
    prompts: Sequence[Sequence[int]],
    options: SDOptions | None = None,
    *,
    seeds: Sequence[int] | None = None,
    request_ids: Sequence[int] | None = None,
    logger: BlockLogger | None = None,
    corrector: Corrector | None = None,
    on_finish: Callable[[int, SDOutput], None] | None = None,
    budgets: Sequence[int] | None = None,
) -> SDResult:
    """Decode ``prompts`` (token ids) with ``drafter`` proposing and ``target`` (an HF causal
    LM) verifying (module docstring). ``seeds[r]`` and ``request_ids[r]`` (default r) key
    request r's uniforms. Runs under ``torch.inference_mode``; both models' modes are the
    caller's. ``logger`` receives one block-log row per round (the drafter's Top-K as the
    candidates; greedy or Top-K drafts) and each finished request's row, so
    ``brisk mechanism report`` runs on the log; a logger that collects gets the corrector's
    training events. ``corrector``, the prefix-conditioned head, drafts over the drafter's
    Top-K (module docstring; the head's own device and dtype, the caller's; the keyword
    :func:`brisk.runtime.isd.decode` takes): its K replaces ``options.top_k``.
    ``on_finish(r, output)`` hears request r (its index in ``prompts``) as it finishes.
    ``budgets[r]`` (default ``options.max_new_tokens``, at most that) is request r's token
    budget: ``brisk decode`` lowers it for a prompt too long for the target's positions. The
    requests are checked as every loop checks them
    (:class:`~brisk.runtime.decode_options.Requests`), and the step runs at the drafter's block
    (:meth:`~brisk.runtime.decode_options.SamplingOptions.at_stride`)."""
    options = options or SDOptions()
    check_pair(target, drafter)
    if corrector is not None:
        check_head(target, drafter, corrector, options)
    K = _candidates(target, options, corrector)
    if logger is not None:
        if options.temperature > 0 and options.draft == "sample":
            raise ValueError(
                "draft: a block log holds Top-K candidates; log greedy or top-k drafts, "
                "not drafts from the whole softmax"
            )
        if logger.decoder != "speculative":
            raise ValueError(
                f"logger: writes {logger.decoder!r} logs; a speculative decode's rounds and "
                'requests count other forwards (BlockLogger(..., decoder="speculative"))'
            )
        if (logger.M, logger.K) != (drafter.spec.M, K):
            raise ValueError(
                f"logger: holds M = {logger.M}, K = {logger.K}; the drafter's block gives "
                f"M = {drafter.spec.M} and {'the corrector' if corrector else 'top_k'} K = {K}"
            )
        logger.declare(verification_of(options, corrector))
    M = drafter.spec.M
    requests = Requests.check(
        prompts, options, seeds=seeds, request_ids=request_ids, budgets=budgets
    ).within(
        getattr(target.config, "max_position_embeddings", None),
        M + 1,
        f"a block of {M + 1}",
        holder="the target",
    )
    timing = [0.0, 0.0]
    ctx = StepContext(
        options.at_stride(M + 1, K),
        K,
        backbone=target_heads(target) if corrector is not None else None,  # type: ignore[arg-type]
        corrector=corrector,
        log=logger is not None,
        collect=logger is not None and logger.collects,
    )
    with torch.inference_mode():
        outputs = []
        rows = zip(prompts, requests.seeds, requests.request_ids, requests.budgets, strict=True)
        for i, (p, s, r, b) in enumerate(rows):
            mine = options if b == options.max_new_tokens else options.replace(max_new_tokens=b)
            outputs.append(_decode_one(target, drafter, p, mine, s, r, timing, logger, ctx))
            if logger is not None:
                logger.log_request(r, len(p), outputs[-1])
            if on_finish is not None:
                on_finish(i, outputs[-1])
    return SDResult(outputs, M, draft_seconds=timing[0], verify_seconds=timing[1])
