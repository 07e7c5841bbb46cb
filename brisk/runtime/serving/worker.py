"""``BriskISDWorker``: ISD as SGLang speculative algorithm ``BRISK_ISD`` (a chain verify).

ISD is self-speculative: one forward of ``[pending, x_1..x_M, MASK×M]`` (n = 2M + 1 verify
slots per request, ``--speculative-num-draft-tokens 2M+1``) verifies the drafts x_1..x_M and
proposes the next block at the MASK slots; a cold start ``[pending, MASK×M]`` pads to the same n
with MASK. SGLang's speculative framework provides the rest: it reserves n KV slots after each
request's ``seq_len`` (the KV length; the pending token sits at position ``seq_len``), returns
the logits of every verify slot (and, with ``CaptureHiddenMode.FULL``, the hidden states), and
commits a variable number of tokens per request.

Per forward and request, brisk's exact step (:func:`brisk.runtime.isd.batched.step`) decides:

- the committed tokens x_1..x_L and the next token (L + 1 of them, ``accept_lens``; the scheduler
  appends them and cuts at EOS / budget / stop strings);
- the slots whose KV stays: 0..L (pending and the accepted drafts), the front of the window,
  already where SGLang keeps them (``seq_len`` advances by L + 1); the KV of MASK slots and
  rejected drafts is never kept (the next window overwrites it);
- the next state, carried between forwards in device tensors indexed by SGLang's request-pool
  index (:class:`PoolStates`): a forward gathers its batch's rows and writes them back, one
  indexed op per state field, whatever requests joined, finished or left.

The prefill forward runs SGLang's plain extend; its next token is brisk's prefill draw
(:func:`~brisk.runtime.isd.batched.first_step`: argmax at T = 0; at T > 0 the request's uniform
at counter 0) from the prompt's last logits, and the request starts the decode with a cold start
from it: the forwards of ``brisk decode``, one for one. A prompt longer than SGLang's chunked
prefill runs as several extends; only the last is the prefill. Uniforms are keyed by (seed, a
hash of the rid, the request's forward counter), so a request's tokens do not depend on its batch.

Options come from the plugin config in the served model's config (:class:`BriskISDOptions`,
:mod:`brisk.runtime.serving.options`); the server refuses to start when its stride disagrees
with ``--speculative-num-draft-tokens``. What both brisk algorithms share (the chain verify's
input, the prefill's refusals, SGLang's results, the TPF log) is
:mod:`brisk.runtime.serving.chain_worker`'s.

With ``log_blocks`` TP rank 0 writes one mechanism-format block-log row per verify round
(:func:`brisk.runtime.isd.blocklog.log_verified`, as brisk's decode does). The prefill's token is
not a verify round and has no row. SGLang never closes its speculative worker and stops the
scheduler by a signal, so the rows are flushed whenever the worker falls idle (its last request
finished), and at exit. When it falls idle the worker also logs the server's TPF so far:
committed tokens ÷ request-forwards, prefills included (a last round's tokens past a request's
budget count; SGLang's own ``accept len`` leaves the prefill out). Per request it is
``completion_tokens ÷ (spec_verify_ct + 1)`` of the answer's ``meta_info``. Beside it, per batch
size, the decode forwards' time in the model and the worker's own host time around it.
"""

from __future__ import annotations

import atexit
import dataclasses
import time
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.backbone import ModelHeads
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd.batched import ISDState, StepContext, first_step, init_state, step
from brisk.runtime.isd.blocklog import log_verified, verification_for
from brisk.runtime.serving.chain import PoolStates
from brisk.runtime.serving.chain_worker import (
    ChainSpec,
    ChainWorker,
    commits_prefill,
    pool_indices_cpu,
)
from brisk.runtime.serving.common import ALGORITHM, check_model, rank_logger, request_key
from brisk.runtime.serving.options import BriskISDOptions, OptionError

__all__ = ["ALGORITHM", "BriskISDSpec", "BriskISDWorker"]


class BriskISDSpec(ChainSpec):
    """``BRISK_ISD`` for SGLang's dispatch: a chain speculator
    (:class:`~brisk.runtime.serving.chain_worker.ChainSpec`) that refuses at launch what it
    cannot serve."""

    def handle_server_args(self, server_args: Any) -> None:
        """Refuse to start, with one line naming the option, what ``BRISK_ISD`` cannot serve.

        SGLang calls this while it resolves the server's arguments, before any model loads
        (with a recorder that reads through to ``server_args``): the options of the plugin
        config (:meth:`BriskISDOptions.from_mapping`: unknown or ill-typed keys, a corrector's
        K against ``top_k``), the verify width against the stride (n = 2N − 1 slots, a chain),
        and the model's config and the corrector against the options
        (:func:`~brisk.runtime.serving.common.check_model`), the config read as SGLang reads it
        (``model_config_of``: its overrides and ``--json-model-override-args`` apply)."""
        from sglang.srt.arg_groups.model_override_base import model_config_of
        from sglang.srt.arg_groups.overrides import resolving_view

        model_config = model_config_of(server_args)
        options = BriskISDOptions.of_model(model_config.hf_config)
        n = resolving_view(server_args).speculative_num_draft_tokens
        if n != options.block_size:
            raise OptionError(
                f"--speculative-num-draft-tokens: BRISK_ISD at stride {options.stride} verifies "
                f"2N − 1 = {options.block_size} slots per request, got {n}"
            )
        check_model(options, model_config)


class BriskISDWorker(ChainWorker):
    """The speculative worker: SGLang's target forward, brisk's step (module doc), on the chain
    verify of :class:`~brisk.runtime.serving.chain_worker.ChainWorker`."""

    algorithm = ALGORITHM
    options_type = BriskISDOptions
    options: BriskISDOptions

    def _setup(self) -> None:
        model_config, opt = self.model_runner.model_config, self.options
        if self.draft_token_num != opt.block_size:
            raise OptionError(
                f"--speculative-num-draft-tokens: need {opt.block_size} at stride "
                f"{opt.stride}, got {self.draft_token_num}"
            )
        # refused at launch already (handle_server_args); kept for workers built otherwise
        check_model(opt, model_config)
        self.mask_id = int(model_config.hf_config.mask_token_id)
        self.corrector = Corrector.from_pretrained(opt.corrector) if opt.corrector else None
        K = self.corrector.config.K if self.corrector is not None else opt.top_k
        self.logger = rank_logger(opt.log_blocks, opt.M, K) if opt.log_blocks else None
        if self.logger is not None:
            self.logger.declare(verification_for(opt, self.corrector))
            atexit.register(self.logger.close)
        log = self.logger is not None
        self.ctx = StepContext(opt, K, log=log)
        if self.corrector is not None:
            self.corrector.impl = opt.impl
            heads = ModelHeads(self.model_runner.model, self.vocab)
            self.corrector.to(heads.device)
            head = _replayed(self.corrector, heads, opt.impl)
            self.ctx = StepContext(opt, K, heads, head, log=log)  # type: ignore[arg-type]
        self.rows: PoolStates | None = None  # allocated with the pools (alloc_memory_pool)

    def alloc_memory_pool(self, **kwargs: Any) -> None:
        super().alloc_memory_pool(**kwargs)
        rows = int(self.req_to_token_pool.req_to_token.shape[0])
        self.rows = PoolStates(rows, self.ctx, self.device)

    def clear_cache_pool(self) -> None:
        if self.rows is not None:
            self.rows.clear()

    def _idle(self) -> None:
        """The block log's rows reach disk, and the TPF and forward times so far are logged."""
        if self.logger is not None:
            self.logger.flush()
        super()._idle()
        self.log.info(
            "BRISK_ISD decode forwards since start, by batch size: %s", self.clock_report()
        )

    # -- prefill: plain extend, the first token by brisk's prefill draw (first_step)
    def _prefill(self, batch: Any, pp_proxy_tensors: Any) -> Any:
        argmax_rows = self._refuse(batch)
        # is_verify: no SGLang sampling, whose temperature scaling and softmax run in place on
        # these logits (brisk draws the token itself, below)
        result = self.target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True
        )
        bs = len(batch.reqs)
        logits = result.logits_output.next_token_logits[:, : self.vocab]  # [bs, V]
        device = logits.device
        seeds = torch.tensor([self._seed(r) for r in batch.reqs], dtype=torch.long)
        keys = torch.tensor([request_key(r.rid) for r in batch.reqs], dtype=torch.long)
        # the forwards a request has run are at most its output tokens (each commits ≥ 1), so
        # a re-prefilled (retracted) request's counter resumes past every uniform it has used
        counters = torch.tensor([len(r.output_ids) for r in batch.reqs], dtype=torch.long)
        lengths = torch.tensor(
            [len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs], dtype=torch.long
        )
        rows = first_step(logits, lengths, seeds, keys, self.ctx, counters).state
        argmax = torch.tensor(argmax_rows, device=device)
        first = torch.where(argmax, logits.argmax(-1), rows.pending)
        rows = dataclasses.replace(rows, pending=first)
        # Only a prompt's last chunk is the prefill (SGLang drops the token of the chunks
        # before it, and of requests finished or retracted meanwhile): it alone draws the first
        # token, takes a row and counts a forward.
        done = [i for i, r in enumerate(batch.reqs) if commits_prefill(r)]
        if done:
            index_cpu = pool_indices_cpu(batch)
            at = torch.tensor(done)
            if len(done) < bs:
                rows = rows.select(at.to(device))
            assert self.rows is not None, "alloc_memory_pool runs before any forward"
            self.rows.write(batch.req_pool_indices[at.to(batch.req_pool_indices.device)], rows)
            self.rows.claim(index_cpu[at], self.req_to_token_pool.req_generation)
        return self._prefill_result(batch, result, first, len(done))

    # -- decode: one ISD round per request
    def _states(self, batch: Any) -> ISDState:
        """The batch's rows, after cold-starting those that have none of their request's:
        a request that reaches decode without a prefill here starts from its last token, its
        counter past every forward it can have run (the check reads CPU tensors only)."""
        assert self.rows is not None, "alloc_memory_pool runs before any forward"
        index_cpu, generation = pool_indices_cpu(batch), self.req_to_token_pool.req_generation
        missing = self.rows.missing(index_cpu, generation)
        if bool(missing.any()):
            cold = missing.nonzero()[:, 0].tolist()
            reqs = [batch.reqs[i] for i in cold]
            last = [(r.output_ids or r.origin_input_ids)[-1] for r in reqs]
            length = torch.tensor([len(r.origin_input_ids) + len(r.output_ids) for r in reqs])
            seeds = torch.tensor([self._seed(r) for r in reqs])
            keys = torch.tensor([request_key(r.rid) for r in reqs])
            state = init_state(
                torch.tensor(last, device=self.device),
                length,
                seeds,
                keys,
                self.ctx,
                counter=length,
            )
            at = torch.tensor(cold)
            self.rows.write(batch.req_pool_indices[at.to(batch.req_pool_indices.device)], state)
            self.rows.claim(index_cpu[at], generation)
        return self.rows.read(batch.req_pool_indices)

    def _verify_input(self, batch: Any, state: ISDState) -> Tensor:
        """Write the verify slots into ``batch`` and return them ``[bs, n]``: ids
        ``[pending, x_1..x_M or MASK×M, MASK×M]`` at positions ``seq_len + j``, a causal chain."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        bs, n, M = len(batch.reqs), self.draft_token_num, self.options.M
        device = batch.seq_lens.device
        ids = torch.full((bs, n), self.mask_id, dtype=torch.long, device=device)
        ids[:, 0] = state.pending
        ids[:, 1 : M + 1] = torch.where(state.verify[:, None], state.draft.tokens, self.mask_id)
        self._chain_input(batch, ids)
        if self.corrector is not None:
            batch.spec_info.capture_hidden_mode = CaptureHiddenMode.FULL
        return ids

    def _decode(self, batch: Any, on_publish: Any, pp_proxy_tensors: Any) -> Any:
        started = time.perf_counter()
        bs, n = len(batch.reqs), self.draft_token_num
        self._running = bs
        state = self._states(batch)
        self._verify_input(batch, state)
        model_started = time.perf_counter()
        out = self.target_worker.forward_batch_generation(
            batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True
        )
        model_s = time.perf_counter() - model_started
        lo = out.logits_output
        logits = lo.next_token_logits.view(bs, n, -1)[..., : self.vocab]
        hidden = getattr(lo, "hidden_states", None)
        if hidden is None:
            if self.corrector is not None:
                raise RuntimeError("BRISK_ISD: the corrector needs the verify hidden states")
            hidden = logits.new_zeros(bs, n, 1)
        result = step(state, logits, hidden.view(bs, n, -1), self.ctx)
        if self.logger is not None:
            log_verified(self.logger, state, result, logits, self.options.temperature)
        tokens = torch.zeros(bs, n, dtype=torch.int32, device=logits.device)
        tokens[:, : result.tokens.shape[1]] = result.tokens.to(torch.int32)
        assert self.rows is not None
        self.rows.write(batch.req_pool_indices, result.state)
        answer = self._decode_result(batch, out, tokens, result.count.to(torch.int32), on_publish)
        clock = self.clock.setdefault(bs, [0, 0.0, 0.0])
        clock[0] += 1
        clock[1] += model_s
        clock[2] += time.perf_counter() - started
        return answer


def _replayed(head: Corrector, heads: ModelHeads, impl: str) -> Any:
    """The head the step calls: replayed from CUDA graphs on a GPU (one capture per batch
    bucket and temperature, :class:`~brisk.runtime.kernels.corrector_step.graph.CorrectorGraphs`:
    a verify round's head is a few small launches, which the replay makes one); eager
    elsewhere."""
    if heads.device.type != "cuda":
        return head
    from brisk.runtime.kernels.corrector_step.graph import CorrectorGraphs

    graph_impl = "triton" if impl == "auto" else impl
    return CorrectorGraphs(head, heads, impl=graph_impl)  # type: ignore[arg-type]
