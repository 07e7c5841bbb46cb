"""``BriskDrafterWorker``: a DFlash-format block drafter verified by the served AR target, as
SGLang speculative algorithm ``BRISK_DRAFTER`` (SGLang's own DFLASH worker needs CUDA; this
one runs wherever the target runs, the CPU included).

The drafter (:class:`~brisk.runtime.drafter.DFlashDrafter`) lives in the worker's process, on
the target's device and in its dtype; it owns no embedding and no LM head (the served target's
are used). Per round and request, what :func:`brisk.runtime.drafter.speculative_decode` does:

1. **draft**: the drafter runs once on ``[x_0, MASK × M]`` (x_0 the pending token, at position
   ``seq_len``) against its context, the keys and values of every committed position, and
   proposes x_1..x_M by ISD's proposal step (:func:`brisk.runtime.isd.batched.propose`: the
   argmax at T = 0, a draw from the Top-K softmax at T > 0);
2. **verify**: the target runs ``[x_0, x_1..x_M]`` as one chain (B = M + 1 verify slots per
   request, ``--speculative-num-draft-tokens B``) and brisk's one verifier
   (:func:`brisk.runtime.isd.batched.verify_block`) accepts L drafts and gives the next token:
   L + 1 tokens commit (greedy: the target's greedy decoding, token for token). The KV of slots
   0..L stays where SGLang put it; the rejected drafts' is overwritten by the next window;
3. **context**: the target's hidden states at the drafter's ``target_layer_ids`` come from the
   same forwards, captured by SGLang's DFlash hook of the model
   (``set_dflash_layers_to_capture``: the output of decoder layer i, HF ``hidden_states[i +
   1]``), the prompt's from the prefill and slots 0..L's from each verify; the drafter projects
   them into its keys and values once, as brisk's loop does.

The drafter's context is held per request-pool row with the row's generation, as
:class:`~brisk.runtime.serving.chain.PoolStates` keys ISD's state: a row written for an earlier
request is never read for a later one. A prompt prefilled in several chunks appends each chunk's
features; a request that reaches a round without them drafts from what it has (still exact:
verification does not depend on how the drafts were made). Uniforms are keyed by (seed, a hash
of the rid, the request's round counter) in ISD's slot layout, so a request's tokens do not
depend on its batch.

Options come from the plugin config in the served model's config
(:class:`~brisk.runtime.serving.drafter_options.BriskDrafterOptions`,
:mod:`brisk.runtime.serving.options`); a drafter that does not fit the target, or a verify width
other than its block, refuses the launch while SGLang resolves its arguments. The chain verify
itself, the prefill's refusals, SGLang's results and the TPF log are
:mod:`brisk.runtime.serving.chain_worker`'s, shared with ``BRISK_ISD``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.drafter import DFlashDrafter, load_drafter
from brisk.runtime.drafter.speculative import extend_kv
from brisk.runtime.isd.batched import StepContext, draw_next, propose, verify_block
from brisk.runtime.sampling import Slots
from brisk.runtime.serving.chain_worker import (
    ChainSpec,
    ChainWorker,
    commits_prefill,
    pool_indices_cpu,
)
from brisk.runtime.serving.common import request_key
from brisk.runtime.serving.drafter_options import DRAFTER_ALGORITHM as ALGORITHM
from brisk.runtime.serving.drafter_options import BriskDrafterOptions, check_drafter_pair
from brisk.runtime.serving.options import OptionError

__all__ = ["ALGORITHM", "BriskDrafterSpec", "BriskDrafterWorker"]


class BriskDrafterSpec(ChainSpec):
    """``BRISK_DRAFTER`` for SGLang's dispatch: like ``BRISK_ISD`` a chain speculator without
    SGLang draft KV (the drafter's context is the worker's own), so SGLang's NGRAM paths."""

    def handle_server_args(self, server_args: Any) -> None:
        """Refuse to start, in one line, options that do not parse, a drafter that was not built
        for the served model (:func:`check_drafter_pair`) and a verify width other than the
        drafter's block; before any model loads."""
        from sglang.srt.arg_groups.model_override_base import model_config_of
        from sglang.srt.arg_groups.overrides import resolving_view

        hf_config = model_config_of(server_args).hf_config
        options = BriskDrafterOptions.of_model(hf_config)
        block = check_drafter_pair(hf_config, options.drafter)
        n = resolving_view(server_args).speculative_num_draft_tokens
        if n != block:
            raise OptionError(
                f"--speculative-num-draft-tokens: the drafter's block is {block} slots "
                f"([pending, {block - 1} drafts]), got {n}"
            )


@dataclass
class _Context:
    """One request's drafter context: every layer's keys and values ``[1, kv_heads, C, d]`` of
    its last C committed positions (``end`` is the next one: the pending token's), and its
    uniforms' seed, key and round counter."""

    rid: str
    generation: int
    kv: list[tuple[Tensor, Tensor]] | None
    end: int
    seed: int
    key: int
    counter: int

    @property
    def size(self) -> int:
        return 0 if self.kv is None else int(self.kv[0][0].shape[2])

    def append(self, kv: list[tuple[Tensor, Tensor]]) -> None:
        self.kv = extend_kv(self.kv, kv)


class BriskDrafterWorker(ChainWorker):
    """The speculative worker: the drafter's block, SGLang's target verify forward, brisk's
    verifier (module doc), on the chain verify of
    :class:`~brisk.runtime.serving.chain_worker.ChainWorker`."""

    algorithm = ALGORITHM
    options_type = BriskDrafterOptions
    options: BriskDrafterOptions

    def _setup(self) -> None:
        model, opt = self.model_runner.model, self.options
        dtype = next(model.parameters()).dtype
        self.drafter: DFlashDrafter = load_drafter(opt.drafter, device=self.device).to(dtype)
        self.drafter.eval()
        spec = self.drafter.spec
        if self.draft_token_num != spec.block_size:
            raise OptionError(
                f"--speculative-num-draft-tokens: the drafter's block is {spec.block_size}, "
                f"got {self.draft_token_num}"
            )
        self.M = spec.M
        # SGLang's DFlash capture: the model returns, beside its output, the residual stream
        # entering layers i + 1 (the output of layer i) for the drafter's ids, packed
        # [tokens, k·H] into the logits output's hidden states under CaptureHiddenMode.FULL
        if not hasattr(model, "set_dflash_layers_to_capture"):
            raise OptionError(
                f"--model-path: SGLang's {type(model).__name__} cannot capture the hidden states "
                "a drafter reads (no set_dflash_layers_to_capture)"
            )
        model.set_dflash_layers_to_capture(list(spec.target_layer_ids))
        self.embed = model.model.embed_tokens
        self.lm_head = model.lm_head.weight[: self.vocab]  # [V, H] (SGLang pads the rows)
        K = min(opt.top_k, self.vocab)
        # the proposal step's law at the drafter's block: brisk's loop's draft "top-k"
        self.ctx = StepContext(opt.at_stride(spec.block_size, K), K)
        self.slots = Slots(self.M)
        self.contexts: dict[int, _Context] = {}  # by request-pool row
        self._rows_of: dict[str, int] = {}
        self.log.info(
            "BRISK_DRAFTER: drafter %s (block %d, target layers %s), temperature %s",
            opt.drafter,
            spec.block_size,
            list(spec.target_layer_ids),
            opt.temperature,
        )

    def clear_cache_pool(self) -> None:
        self.contexts.clear()
        self._rows_of.clear()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        row = self._rows_of.pop(rid, None)
        if row is not None and row in self.contexts and self.contexts[row].rid == rid:
            del self.contexts[row]
        super().note_request_finished(rid=rid, natural_stop=natural_stop)

    # -- the drafter's context
    def _context_kv(self, features: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every drafter layer's keys and values ``[B, kv_heads, S, d]`` of target features
        ``[B, S, k·H]`` at ``positions [B, S]``."""
        d = self.drafter
        return d.context_kv(d.project(features), positions)  # type: ignore[no-any-return]

    def _context_of(self, req: Any, row: int, generation: int) -> _Context:
        """The request's context, a new empty one when its row holds none of its own."""
        held = self.contexts.get(row)
        if held is not None and held.rid == req.rid and held.generation == generation:
            return held
        params = req.sampling_params
        seed = getattr(params, "sampling_seed", None)
        length = len(req.origin_input_ids) + len(req.output_ids)
        fresh = _Context(
            rid=req.rid,
            generation=generation,
            kv=None,
            end=length - 1 if req.output_ids else 0,
            seed=int(seed) if seed is not None else self.options.seed,
            key=request_key(req.rid),
            counter=len(req.output_ids),
        )
        self.contexts[row] = fresh
        self._rows_of[req.rid] = row
        return fresh

    # -- prefill: plain extend with the drafter's features captured; the first token drawn as
    # brisk's loop draws it
    def _prefill(self, batch: Any, pp_proxy_tensors: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        argmax_rows = self._refuse(batch)
        result = self.target_worker.forward_batch_generation(
            batch,
            pp_proxy_tensors=pp_proxy_tensors,
            is_verify=True,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        lo = result.logits_output
        logits = lo.next_token_logits[:, : self.vocab]  # [bs, V]
        device = logits.device
        features = _captured(lo)  # [Σ extend, k·H]
        index_cpu = pool_indices_cpu(batch).tolist()
        generation = self.req_to_token_pool.req_generation
        starts = [int(p) for p in batch.prefix_lens]
        lengths = [int(n) for n in batch.extend_lens]
        positions = torch.cat(
            [torch.arange(s, s + n, device=device) for s, n in zip(starts, lengths, strict=True)]
        )
        kv = self._context_kv(features[None], positions[None])  # one call for the batch
        contexts, at = [], 0
        for i, req in enumerate(batch.reqs):
            row = index_cpu[i]
            held = self.contexts.get(row)
            if held is None or held.rid != req.rid or starts[i] == 0 or held.end != starts[i]:
                # a new request, a re-prefill, or a prefix whose features this worker lacks
                self.contexts.pop(row, None)
            context = self._context_of(req, row, int(generation[row]))
            if context.kv is None:
                context.end = starts[i]
            stop = at + lengths[i]
            context.append([(k[:, :, at:stop], v[:, :, at:stop]) for k, v in kv])
            context.end, at = context.end + lengths[i], stop
            contexts.append(context)
        u = self._uniforms(contexts)
        drawn = draw_next(logits, self.options.temperature, u[:, self.slots.next])
        first = torch.where(torch.tensor(argmax_rows, device=device), logits.argmax(-1), drawn)
        done = [i for i, r in enumerate(batch.reqs) if commits_prefill(r)]
        for i in done:
            contexts[i].counter += 1
        return self._prefill_result(batch, result, first, len(done))

    def _uniforms(self, contexts: list[_Context]) -> Tensor:
        """The round's uniforms ``[B, 2M + 1]`` of each request's (seed, key, counter)."""

        def column(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=self.device)

        return self.ctx.uniforms(
            column([c.seed for c in contexts]),
            column([c.key for c in contexts]),
            column([c.counter for c in contexts]),
        )

    # -- decode: one drafter block and one verify forward per request
    def _draft(self, anchors: Tensor, starts: Tensor, contexts: list[_Context], u: Tensor) -> Any:
        """The batch's drafts (a :class:`~brisk.runtime.isd.batched.Draft`): the drafter on
        ``[x_0, MASK × M]`` at positions ``starts [B]`` .. against each request's context, the
        contexts padded to the longest and the padding masked out."""
        B, M, device = len(contexts), self.M, anchors.device
        block = torch.full((B, M + 1), self.drafter.spec.mask_token_id, device=device)
        block[:, 0] = anchors
        positions = starts.long()[:, None] + torch.arange(M + 1, device=device)
        sizes = torch.tensor([c.size for c in contexts], device=device)
        C = max(c.size for c in contexts)
        attn = self.drafter.layers[0].self_attn
        padded = []
        for j in range(len(self.drafter.layers)):
            k = self.lm_head.new_zeros(B, attn.kv_heads, C, attn.head_dim)
            v = torch.zeros_like(k)
            for b, c in enumerate(contexts):
                if c.kv is not None:
                    k[b, :, : c.size], v[b, :, : c.size] = c.kv[j][0][0], c.kv[j][1][0]
            padded.append((k, v))
        seen = torch.arange(C, device=device)[None] < sizes[:, None]  # [B, C]
        mask = torch.cat([seen, seen.new_ones(B, M + 1)], 1)[:, None, None]
        embeds = self.embed(block.flatten()).view(B, M + 1, -1)
        hidden = self.drafter(embeds, positions, padded, mask.expand(B, 1, M + 1, C + M + 1))
        hidden = hidden[:, 1:]  # [B, M, H] the MASK slots
        logits = hidden @ self.lm_head.T  # [B, M, V]
        # the anchor's hidden state is zero, as in brisk's loop and SGLang's DFlash sampler
        anchor_hidden = hidden.new_zeros(B, hidden.shape[-1])
        offsets = starts.long() + 1
        return propose(logits, hidden, anchor_hidden, anchors, offsets, u[:, 1 + M :], self.ctx)

    def _decode(self, batch: Any, on_publish: Any, pp_proxy_tensors: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        bs, n, M = len(batch.reqs), self.draft_token_num, self.M
        self._running = bs
        index_cpu = pool_indices_cpu(batch).tolist()
        generation = self.req_to_token_pool.req_generation
        contexts = [
            self._context_of(r, row, int(generation[row]))
            for r, row in zip(batch.reqs, index_cpu, strict=True)
        ]
        device = batch.seq_lens.device
        anchors = torch.tensor([r.output_ids[-1] for r in batch.reqs], device=device)
        u = self._uniforms(contexts)
        with torch.inference_mode():
            draft = self._draft(anchors, batch.seq_lens, contexts, u)
        ids = torch.cat([anchors[:, None], draft.tokens], 1)  # [bs, n]
        self._chain_input(batch, ids)
        batch.spec_info.capture_hidden_mode = CaptureHiddenMode.FULL
        out = self.target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True
        )
        lo = out.logits_output
        logits = lo.next_token_logits.view(bs, n, -1)[..., : self.vocab]
        T = self.options.temperature
        L, nxt = verify_block(logits, draft, T, u[:, 1 : 1 + M], u[:, self.slots.next])
        features = _captured(lo).view(bs, n, -1)
        positions = batch.seq_lens.long()[:, None] + torch.arange(n, device=device)
        with torch.inference_mode():
            kv = self._context_kv(features, positions)
        for b, (c, kept) in enumerate(zip(contexts, (L + 1).tolist(), strict=True)):
            c.append([(k[b : b + 1, :, :kept], v[b : b + 1, :, :kept]) for k, v in kv])
            c.end += kept
            c.counter += 1
        tokens = torch.zeros(bs, n, dtype=torch.int32, device=device)
        tokens[:, :M] = draft.tokens.to(torch.int32)
        tokens[torch.arange(bs, device=device), L] = nxt.to(torch.int32)
        return self._decode_result(batch, out, tokens, (L + 1).to(torch.int32), on_publish)


def _captured(logits_output: Any) -> Tensor:
    """The forward's captured drafter features ``[tokens, k·H]``, taken off the output (the
    scheduler need not carry them)."""
    features = logits_output.hidden_states
    if features is None:
        raise RuntimeError(
            f"{ALGORITHM}: the target's forward returned no captured hidden states (a CUDA graph "
            "captured before the drafter's layers were set? run without CUDA graphs)"
        )
    logits_output.hidden_states = None
    return features  # type: ignore[no-any-return]
