"""brisk's decoding loop around the batched ISD step: prefill, forward, KV bookkeeping, logs.

:func:`decode` runs batches of requests in lock step. The prefill runs the whole prompts and
commits each request's first token (:func:`~brisk.runtime.isd.batched.first_step`, as SGLang's
prefill does, so the server and this loop run the same forwards). Per round it builds the input
slots of every row from the state, runs the backbone's forward, hands logits and hidden states
to :func:`brisk.runtime.isd.batched.step`, and then applies the KV side of the result: rows of
one batch share one physical cache but not a history (:class:`KVSlots`); each row keeps the
slots the step marks, rejected proposals and MASK slots are dropped, and the cache is compacted
(tail trim, and a per-row gather once holes pile up) so attention never runs over much dead
space. Finished rows leave the batch at once. A single row needs no mask at all: its cache is
always dense.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from brisk.runtime.backbone import Backbone
from brisk.runtime.corrector import Corrector
from brisk.runtime.decode_options import ISDOptions, Requests
from brisk.runtime.isd.batched import StepContext, StepResult, first_step, step
from brisk.runtime.isd.blocklog import BlockLogger, log_verified, token_logp, verification_for
from brisk.runtime.isd.outputs import Outputs, commit
from brisk.runtime.isd.result import DecodeResult, RequestOutput
from brisk.runtime.sampling import Slots

__all__ = ["KVSlots", "decode"]


class KVSlots:
    """Which physical cache slots each row owns, and each row's logical length.

    A new slot always attends to itself, so padding slots never produce an all-masked attention
    row (and NaNs).
    """

    def __init__(self, batch: int, device: torch.device) -> None:
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # [B, T]
        self.length = torch.zeros(batch, dtype=torch.long, device=device)  # [B] logical

    @property
    def physical(self) -> int:
        return int(self.valid.shape[1])

    def attention(self, new_valid: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean mask ``[B, 1, S, T + S]`` and position ids ``[B, S]`` for S new slots."""
        B, S = new_valid.shape
        T, device = self.physical, new_valid.device
        causal = torch.ones(S, S, dtype=torch.bool, device=device).tril()
        eye = torch.eye(S, dtype=torch.bool, device=device)
        new = (causal[None] & new_valid[:, None, :]) | eye
        mask = torch.cat([self.valid[:, None, :].expand(B, S, T), new], dim=-1)[:, None]
        return mask, self.length[:, None] + torch.arange(S, device=device)

    def append(self, keep: Tensor) -> None:
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.length += keep.sum(1)

    def tail(self) -> int:
        """Physical length that still holds an owned slot; drops the unowned tail."""
        owned = self.valid.any(0).nonzero()
        keep = int(owned[-1]) + 1 if len(owned) else 0
        self.valid = self.valid[:, :keep]
        return keep

    def packed(self, rows: Tensor) -> Tensor:
        """Slots ``[B', T']`` that move rows ``rows``' owned slots to the front, in order; the
        bookkeeping switches to that layout (``Backbone.gather`` does the same to the cache)."""
        valid, length = self.valid[rows], self.length[rows]
        width = int(length.max()) if len(length) else 0
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :width]
        self.valid = torch.arange(width, device=valid.device)[None] < length[:, None]
        self.length = length
        return order


def decode(
    backbone: Backbone,
    prompts: Sequence[Sequence[int]],
    options: ISDOptions | None = None,
    *,
    corrector: Corrector | None = None,
    seeds: Sequence[int] | None = None,
    request_ids: Sequence[int] | None = None,
    logger: BlockLogger | None = None,
    batch_size: int = 64,
    prefill_chunk: int = 8192,
    on_finish: Callable[[int, RequestOutput], None] | None = None,
    budgets: Sequence[int] | None = None,
    fit_positions: bool = False,
) -> DecodeResult:
    """Decode ``prompts`` (token ids, BOS included if the model wants one) with ISD.

    ``seeds[r]`` (default r) and ``request_ids[r]`` (default r) key request r's uniforms, so its
    output depends only on its prompt, seed and id: not on the batch, its order or the device.
    Stop at ``options.eos_token_id`` (included in the output) or at request r's budget,
    ``budgets[r]`` new tokens (each 1..``options.max_new_tokens``; default that for every
    request): a request's tokens do not depend on the others' budgets. With ``fit_positions``
    a budget that does not fit the model's positions after its prompt (and the 2M slots of a
    verify round) is lowered to what does, instead of refused. The requests are checked as every
    loop checks them (:class:`~brisk.runtime.decode_options.Requests`).
    ``logger`` receives one block-log row per verify round and, when a request finishes, its
    row of the request table (the log records how it was verified); ``on_finish(r, output)`` is
    called as soon as request r finishes. Runs under ``torch.inference_mode``; the model's
    train/eval mode is the caller's.

    Memory: the prefill runs the prompts in chunks of at most ``prefill_chunk`` tokens per
    forward (all rows of the batch together) and computes the logits of each row's last prompt
    position only; a verify round computes logits for its 2N − 1 slots, all of which it reads.
    No ``[B, prompt, V]`` tensor exists.
    """
    options = options or ISDOptions()
    requests = Requests.check(
        prompts, options, seeds=seeds, request_ids=request_ids, budgets=budgets
    )
    for name, value in (("batch_size", batch_size), ("prefill_chunk", prefill_chunk)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an integer ≥ 1, got {value!r}")
    if corrector is not None and corrector.config.M != options.M:
        raise ValueError(f"corrector: built for M = {corrector.config.M}, stride gives {options.M}")
    spare = f"2M ({2 * options.M}, stride {options.stride})"
    requests = requests.within(backbone.max_positions, 2 * options.M, spare, fit=fit_positions)
    K = corrector.config.K if corrector is not None else min(options.top_k, backbone.vocab_size)
    if logger is not None and (logger.M, logger.K) != (options.M, K):
        raise ValueError(
            f"logger: holds M = {logger.M}, K = {logger.K}; decoding uses {options.M}, {K}"
        )
    ctx = StepContext(
        options,
        K,
        backbone,
        corrector,
        log=logger is not None,
        collect=logger is not None and logger.collects,
    )
    if logger is not None:
        logger.declare(verification_for(options, corrector))
    outputs: list[RequestOutput | None] = [None] * len(prompts)

    def finish(r: int, output: RequestOutput) -> None:
        outputs[r] = output
        if logger is not None:
            logger.log_request(requests.request_ids[r], len(prompts[r]), output)
        if on_finish is not None:
            on_finish(r, output)

    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            index = list(range(start, min(start + batch_size, len(prompts))))
            _Batch(
                backbone,
                ctx,
                logger,
                [list(requests.prompts[r]) for r in index],
                [requests.seeds[r] for r in index],
                [requests.request_ids[r] for r in index],
                [requests.budgets[r] for r in index],
                index,
                finish,
                prefill_chunk,
            ).run()
    assert all(o is not None for o in outputs)
    return DecodeResult([o for o in outputs if o is not None], options.M)


class _Batch:
    """One batch in lock step: the forward and the KV cache around :func:`step`."""

    def __init__(
        self,
        backbone: Backbone,
        ctx: StepContext,
        logger: BlockLogger | None,
        prompts: list[list[int]],
        seeds: list[int],
        request_ids: list[int],
        budgets: list[int],
        index: list[int],
        finish: Callable[[int, RequestOutput], None],
        prefill_chunk: int,
    ) -> None:
        assert isinstance(ctx.options, ISDOptions), "brisk's loop steps with its ISDOptions"
        self.bb, self.ctx, self.options = backbone, ctx, ctx.options
        self.logger, self.finish = logger, finish
        self.prefill_chunk = prefill_chunk
        self.device = torch.device(backbone.device)
        self.prompts = prompts
        self.index = torch.tensor(index)  # row → request position in the decode call
        self.cache = backbone.new_cache()
        self.kv = KVSlots(len(prompts), self.device)
        seed, request = torch.tensor(seeds), torch.tensor(request_ids)
        self.seed, self.request = seed, request
        self.outputs = Outputs.empty(len(prompts), self.options, self.device, torch.tensor(budgets))
        # Every uniform the batch can use, [B, forwards, 2M + 1]: a forward commits ≥ 1 token,
        # so no request runs more than max_new_tokens of them (greedy decoding without a log
        # reads none: ctx.needs_uniforms).
        R, W = self.options.max_new_tokens, Slots(ctx.M).width
        counter = torch.arange(R).repeat(len(prompts))
        self.uniforms = (
            ctx.uniforms(seed.repeat_interleave(R), request.repeat_interleave(R), counter)
            .reshape(len(prompts), R, W)
            .to(self.device)
        )

    def run(self) -> None:
        self._prefill()
        M = self.ctx.M
        while len(self.index):
            S = 2 * M + 1 if bool(self.state.verify.any()) else M + 1
            alt_logp = self._score_alternatives() if self._scoring else None
            logits, hidden = self._forward(self._inputs(S))
            st = self.state
            u = self.uniforms[torch.arange(len(st.counter), device=self.device), st.counter]
            result = step(st, logits, hidden, self.ctx, u)
            self._keep(result.keep)
            if self.logger is not None:
                self._log(result, logits, alt_logp)
            self.state = result.state
            self.outputs = commit(self.outputs, result, self.options)
            if bool(self.outputs.done.any()):
                self._retire()

    @property
    def _scoring(self) -> bool:
        opt = self.options
        return opt.score_blocks and self.logger is not None and bool(self.state.verify.any())

    # -- the forward and the cache
    def _forward(
        self, new_valid_ids: tuple[Tensor, Tensor], logits_at: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        ids, new_valid = new_valid_ids
        if len(ids) == 1:  # a lone row's cache is dense: plain causal attention
            out = self.bb.forward(ids, self.cache, logits_at=logits_at)
        else:
            mask, positions = self.kv.attention(new_valid)
            out = self.bb.forward(
                ids, self.cache, position_ids=positions, attention_mask=mask, logits_at=logits_at
            )
        return out.logits, out.hidden

    def _prefill(self) -> None:
        """The forward over the whole prompts (right-padded), in chunks of at most
        ``prefill_chunk`` tokens, one forward of the request in all; each row's last prompt
        logits (the only ones computed) give its first token (:func:`first_step`, the request's
        forward 0), committed."""
        B = len(self.prompts)
        lengths = torch.tensor([len(p) for p in self.prompts], device=self.device)
        S = int(lengths.max())
        ids = torch.full((B, S), self.bb.mask_token_id, device=self.device)
        for b, p in enumerate(self.prompts):
            ids[b, : len(p)] = torch.tensor(p)
        valid = torch.arange(S, device=self.device)[None] < lengths[:, None]
        width = max(1, self.prefill_chunk // B)
        last: Tensor | None = None  # [B, V] logits at each row's last prompt position
        for start in range(0, S, width):
            end = min(start + width, S)
            at = (lengths - 1 - start).clamp(0, end - start - 1)
            logits, _ = self._forward((ids[:, start:end], valid[:, start:end]), at[:, None])
            here = (lengths - 1 >= start) & (lengths - 1 < end)
            last = logits[:, 0] if last is None else torch.where(here[:, None], logits[:, 0], last)
            self.kv.append(valid[:, start:end])
        self._compact()
        assert last is not None
        result = first_step(last, lengths, self.seed, self.request, self.ctx, u=self.uniforms[:, 0])
        self.state = result.state
        self.outputs = commit(self.outputs, result, self.options)
        if bool(self.outputs.done.any()):
            self._retire()

    def _inputs(self, S: int) -> tuple[Tensor, Tensor]:
        """``[pending, x_1..x_M, MASK×M]`` for verifying rows, ``[pending, MASK×M, pad]`` for
        cold starts (S = 2M + 1, or M + 1 when every row cold-starts)."""
        M, st = self.ctx.M, self.state
        ids = torch.full((len(st.pending), S), self.bb.mask_token_id, device=self.device)
        ids[:, 0] = st.pending
        new_valid = torch.ones_like(ids, dtype=torch.bool)
        if S == 2 * M + 1:
            verify = st.verify[:, None]
            ids[:, 1 : M + 1] = torch.where(verify, st.draft.tokens, self.bb.mask_token_id)
            new_valid[:, M + 1 :] = verify
        return ids, new_valid

    def _keep(self, keep: Tensor) -> None:
        if len(keep) == 1:  # a lone row keeps a prefix of its new slots: trim, no bookkeeping
            self.bb.trim(
                self.cache, self.bb.cache_length(self.cache) - keep.shape[1] + int(keep.sum())
            )
            return
        self.kv.append(keep)
        self._compact()

    def _compact(self) -> None:
        """Trim the unowned tail; gather once the holes outgrow one round's worth of slots."""
        physical = self.kv.tail()
        self.bb.trim(self.cache, physical)
        if len(self.index) > 1 and physical - int(self.kv.length.max()) > 4 * self.ctx.M + 2:
            rows = torch.arange(len(self.index), device=self.device)
            self.bb.gather(self.cache, rows, self.kv.packed(rows))

    def _retire(self) -> None:
        done = self.outputs.done
        for b in done.nonzero()[:, 0].tolist():
            self.finish(int(self.index[b]), self.outputs.request_output(b, self.ctx.M))
        rows = (~done).nonzero()[:, 0]
        self.index = self.index[rows.cpu()]
        self.state = self.state.select(rows)
        self.outputs = self.outputs.select(rows)
        self.uniforms = self.uniforms[rows]
        if len(rows):
            if len(done) == 1 or self.kv.physical != self.bb.cache_length(self.cache):
                self.kv = _dense_slots(self.bb.cache_length(self.cache), len(done), self.device)
            slots = self.kv.packed(rows)
            self.bb.gather(self.cache, rows, slots)

    # -- diagnostics: block logs and whole-block likelihoods
    def _score_alternatives(self) -> Tensor | None:
        """log p(x_i | c, x_<i) at temperature 1 of each verifying row's other block
        (eq:mech_block_logp), ``[B, M]``, from the prefix c the round starts at: a diagnostic
        forward over the rows whose other block differs from the drafted one, dropped at once.
        None when no row's blocks differ (no forward); rows not scored are NaN."""
        st, M = self.state, self.ctx.M
        alt = st.draft.alt_tokens
        if alt is None:
            return None
        differs = st.verify & (alt != st.draft.tokens).any(1)
        if not bool(differs.any()):
            return None
        ids = torch.cat([st.pending[:, None], alt], 1)
        new_valid = differs[:, None].expand_as(ids).clone()
        new_valid[:, 0] = True
        before = self.bb.cache_length(self.cache)  # a lone row keeps no slot bookkeeping
        at = torch.arange(M, device=self.device).expand(len(ids), M)
        logits, _ = self._forward((ids, new_valid), at)
        self.bb.trim(self.cache, before)
        logp = token_logp(logits, alt)
        return torch.where(differs[:, None], logp, float("nan"))

    def _log(self, result: StepResult, logits: Tensor, alt_logp: Tensor | None) -> None:
        assert self.logger is not None
        opt = self.options
        log_verified(
            self.logger,
            self.state,
            result,
            logits,
            opt.temperature,
            alt_logp,
            scored=opt.score_blocks,
            eos_token_id=opt.eos_token_id,
        )


def _dense_slots(length: int, batch: int, device: torch.device) -> KVSlots:
    kv = KVSlots(batch, device)
    kv.append(torch.ones(batch, length, dtype=torch.bool, device=device))
    return kv
