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

Options come from the YAML/JSON file named by ``$BRISK_ISD_CONFIG`` (:class:`BriskISDOptions`);
the server refuses to start when its stride disagrees with ``--speculative-num-draft-tokens``.

With ``log_blocks`` TP rank 0 writes one mechanism-format block-log row per verify round
(:func:`brisk.runtime.isd.loop.log_verified`, as brisk's decode does). The prefill's token is
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
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_registry import CustomSpecAlgo
from torch import Tensor

from brisk.runtime.backbone import ModelHeads
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd.batched import ISDState, StepContext, first_step, init_state, step
from brisk.runtime.isd.blocklog import verification_for
from brisk.runtime.isd.loop import log_verified
from brisk.runtime.serving.chain import PoolStates, chain_attention, chain_layout, verify_mask
from brisk.runtime.serving.common import (
    check_model,
    rank_logger,
    request_key,
    validate_sampling,
)
from brisk.runtime.serving.launch import ISD_CONFIG_ENV as CONFIG_ENV
from brisk.runtime.serving.options import BriskISDOptions, OptionError

__all__ = [
    "ALGORITHM",
    "CONFIG_ENV",
    "BriskISDSpec",
    "BriskISDWorker",
    "PoolStates",
    "load_options",
    "verify_attention",
    "verify_mask",
]

ALGORITHM = "BRISK_ISD"
_LOG = logging.getLogger("sglang.srt.speculative.brisk_isd")  # SGLang's handlers print it


def load_options() -> BriskISDOptions:
    """The algorithm's options from ``$BRISK_ISD_CONFIG``: a JSON object, or a YAML / JSON
    file (defaults when unset)."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return BriskISDOptions()
    raw = json.loads(path) if path.lstrip().startswith("{") else _read_file(path)
    if not isinstance(raw, dict):
        raise OptionError(f"{CONFIG_ENV}: {path} is not a mapping")
    return BriskISDOptions.from_mapping(raw)


def _read_file(path: str) -> Any:
    text = Path(path).read_text()
    if path.endswith(".json"):
        raw = json.loads(text)
    else:
        import yaml

        raw = yaml.safe_load(text) or {}
    return raw


class BriskISDSpec(CustomSpecAlgo):
    """``BRISK_ISD`` for SGLang's dispatch: a no-draft-model chain speculator, so it takes the
    scheduler's NGRAM paths (``is_ngram``: no draft KV, verify-only forwards) and supplies the
    methods ``CustomSpecAlgo`` lacks in 0.5.23."""

    def is_ngram(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def need_topk(self) -> bool:
        return False

    def get_platform_worker_cls(self) -> type | None:
        return None

    def create_future_map(
        self,
        device: Any,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(
            device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    def handle_server_args(self, server_args: Any) -> None:
        """Refuse to start, with one line naming the option, what ``BRISK_ISD`` cannot serve.

        SGLang calls this while it resolves the server's arguments, before any model loads
        (with a recorder that reads through to ``server_args``): the options of
        ``$BRISK_ISD_CONFIG`` (:meth:`BriskISDOptions.from_mapping`: unknown or ill-typed keys,
        a corrector's K against ``top_k``), the verify width against the stride (n = 2N − 1
        slots, a chain), and the model's config and the corrector against the options
        (:func:`~brisk.runtime.serving.common.check_model`), the config read as SGLang reads it
        (``model_config_of``: its overrides and ``--json-model-override-args`` apply)."""
        from sglang.srt.arg_groups.model_override_base import model_config_of
        from sglang.srt.arg_groups.overrides import resolving_view

        cfg = resolving_view(server_args)
        options = load_options()
        n = cfg.speculative_num_draft_tokens
        if n != options.block_size:
            raise OptionError(
                f"--speculative-num-draft-tokens: BRISK_ISD at stride {options.stride} verifies "
                f"2N − 1 = {options.block_size} slots per request, got {n}"
            )
        check_model(options, model_config_of(server_args))


class BriskISDWorker(BaseSpecWorker):
    """The speculative worker: SGLang's target forward, brisk's step (module doc). Like
    ``NGRAMWorker`` it has no draft model; it shares the target's memory pools."""

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        self._attach(server_args, target_worker)
        self.options = opt = load_options()
        if self.draft_token_num != opt.block_size:
            raise OptionError(
                f"--speculative-num-draft-tokens: need {opt.block_size} at stride "
                f"{opt.stride}, got {self.draft_token_num}"
            )
        # refused at launch already (handle_server_args); kept for workers built otherwise
        check_model(opt, self.model_runner.model_config)
        self.mask_id = int(self.model_runner.model_config.hf_config.mask_token_id)
        self.vocab = int(self.model_runner.model_config.vocab_size)
        self.corrector = Corrector.from_pretrained(opt.corrector) if opt.corrector else None
        K = self.corrector.config.K if self.corrector is not None else opt.top_k
        self.isd = opt.decode_options(top_k=K)
        self.logger = rank_logger(opt.log_blocks, opt.M, K) if opt.log_blocks else None
        if self.logger is not None:
            self.logger.declare(verification_for(self.isd, self.corrector))
            atexit.register(self.logger.close)
        log = self.logger is not None
        self.ctx = StepContext(self.isd, K, log=log)
        if self.corrector is not None:
            self.corrector.impl = opt.impl
            heads = ModelHeads(self.model_runner.model, self.vocab)
            self.corrector.to(heads.device)
            head = _replayed(self.corrector, heads, opt.impl)
            self.ctx = StepContext(self.isd, K, heads, head, log=log)  # type: ignore[arg-type]
        self.rows: PoolStates | None = None  # allocated with the pools (alloc_memory_pool)

    def _attach(self, server_args: Any, target_worker: Any) -> None:
        """What SGLang's scheduler reads of a speculative worker without a draft model (as
        ``NGRAMWorker``: the target's runner, a chain of the verify width), and the counters
        of the chain verify and the TPF log."""
        from sglang.srt.runtime_context import get_device, get_schedule, get_spec

        BaseSpecWorker.__init__(self)
        self.server_args = server_args
        self.enable_overlap = False
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.page_size = get_schedule().page_size
        self.draft_token_num = int(get_spec().speculative_num_draft_tokens)
        self.speculative_num_draft_tokens = self.draft_token_num
        self.max_trie_depth = 1
        self.topk = 1
        self.speculative_num_steps = get_spec().speculative_num_steps
        self.device = get_device().device
        self.adaptive_controller = None
        self.grammar_tree_host = None
        self._chains: dict[int, tuple[Tensor, Tensor | None, Tensor, Tensor, Tensor]] = {}
        self._running = 0  # requests of the last decode batch not yet finished
        # server-wide TPF = tokens / request-forwards; the decode's tokens stay on the device
        # (a running sum, read when the worker falls idle)
        self.forwards = 0
        self._prefill_tokens = 0
        self._decode_tokens = torch.zeros((), dtype=torch.long, device=self.device)
        # decode forwards by batch size: [count, seconds in the model's forward, seconds total]
        self.clock: dict[int, list[float]] = {}

    @property
    def draft_worker(self) -> None:
        return None

    def alloc_memory_pool(self, **kwargs: Any) -> None:
        # the target's pools exist only once the scheduler asks for these
        self.req_to_token_pool, self.token_to_kv_pool_allocator = (
            self._target_worker.get_memory_pool()
        )
        rows = int(self.req_to_token_pool.req_to_token.shape[0])
        self.rows = PoolStates(rows, self.ctx, self.device)

    def clear_cache_pool(self) -> None:
        if self.rows is not None:
            self.rows.clear()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        """When the last request of the decode falls finished (those that finish at the prefill
        never decode; aborted ones finish here too) the worker is idle: the block log's rows
        reach disk and the TPF and forward times so far are logged."""
        self._running -= 1
        if self._running > 0:
            return
        if self.logger is not None:
            self.logger.flush()
        _LOG.info(
            "BRISK_ISD TPF %.3f: %d committed tokens in %d request-forwards since start "
            "(each request's prefill included)",
            self.tpf,
            self.tokens,
            self.forwards,
        )
        _LOG.info("BRISK_ISD decode forwards since start, by batch size: %s", self.clock_report())

    def clock_report(self) -> str:
        """Per batch size B: forwards, mean ms in the model's forward, mean ms of the worker's
        own host time (the rest of the decode: state, verify input, step, KV bookkeeping) and
        that as a share of the forward. On CPU both are wall time; on CUDA the forward's is its
        launch time only (nothing here synchronizes)."""
        parts = []
        for bs, (count, model_s, total_s) in sorted(self.clock.items()):
            host_s = total_s - model_s
            parts.append(
                f"B={bs}: {int(count)} forwards, model {1e3 * model_s / count:.2f} ms, "
                f"host {1e3 * host_s / count:.2f} ms "
                f"({100 * host_s / max(model_s, 1e-12):.1f} %)"
            )
        return "; ".join(parts) or "none"

    @property
    def tokens(self) -> int:
        """Tokens committed since start (reads the device's running sum)."""
        return self._prefill_tokens + int(self._decode_tokens)

    @property
    def tpf(self) -> float:
        """Tokens per forward over all requests served (request-forwards, prefill included)."""
        return self.tokens / max(self.forwards, 1)

    # -- prefill: plain extend, the first token by brisk's prefill draw (first_step)
    def _seed(self, req: Any) -> int:
        seed = getattr(req.sampling_params, "sampling_seed", None)
        return int(seed) if seed is not None else self.options.seed

    def _prefill(self, batch: Any, pp_proxy_tensors: Any) -> Any:

        # A greedy request for one token is served exactly by the prefill's argmax whatever
        # the server's temperature (SGLang's /health_generate asks for one).
        argmax_rows = [_one_greedy_token(r.sampling_params) for r in batch.reqs]
        for req, argmax in zip(batch.reqs, argmax_rows, strict=True):
            why = (
                None if argmax else validate_sampling(req.sampling_params, self.options.temperature)
            )
            if why is None and getattr(req, "return_logprob", False):
                why = "BRISK_ISD does not return logprobs"
            if why is not None and not req.finished():
                req.set_finish_with_abort(why)
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
        done = [i for i, r in enumerate(batch.reqs) if _commits_prefill(r)]
        if done:
            index_cpu = _pool_indices_cpu(batch)
            at = torch.tensor(done)
            if len(done) < bs:
                rows = rows.select(at.to(device))
            assert self.rows is not None, "alloc_memory_pool runs before any forward"
            self.rows.write(batch.req_pool_indices[at.to(batch.req_pool_indices.device)], rows)
            self.rows.claim(index_cpu[at], self.req_to_token_pool.req_generation)
        self.forwards += len(done)
        self._prefill_tokens += len(done)
        next_ids = first
        accept_tokens = torch.zeros(bs, self.draft_token_num, dtype=torch.int32, device=device)
        accept_tokens[:, 0] = next_ids
        accept_lens = torch.ones(bs, dtype=torch.int32, device=device)
        new_seq_lens = batch.seq_lens.clone()
        return batch_result(
            result.logits_output,
            next_ids,
            accept_tokens.flatten(),
            accept_lens,
            new_seq_lens,
            self.draft_token_num,
            result.can_run_cuda_graph,
        )

    # -- decode: one ISD round per request
    def _states(self, batch: Any) -> ISDState:
        """The batch's rows, after cold-starting those that have none of their request's:
        a request that reaches decode without a prefill here starts from its last token, its
        counter past every forward it can have run (the check reads CPU tensors only)."""
        assert self.rows is not None, "alloc_memory_pool runs before any forward"
        index_cpu, generation = _pool_indices_cpu(batch), self.req_to_token_pool.req_generation
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

    def _chain_input(self, batch: Any, ids: Tensor) -> None:
        """Make ``batch`` the chain verify of ``ids [bs, n]`` at positions ``seq_len + j``."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.speculative.ngram_info import NgramVerifyInput

        bs, n = ids.shape
        j, chain, nxt, sibling, retrieve = self._chain(bs)
        # the CPU backend's SDPA reads the chain alone; custom-mask backends read
        # [seq_len prefix ones | chain] rows
        mask = chain if chain is not None else verify_mask(batch.seq_lens, batch.seq_lens_cpu, n)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = ids.flatten()
        # the window's KV slots, reserved by SGLang: req_to_token[r, seq_len : seq_len + n], one
        # gather (what SGLang's assign_extend_cache_locs computes, in fewer ops than its stand-in)
        positions = batch.seq_lens.long()[:, None] + j
        table = batch.req_to_token_pool.req_to_token
        batch.out_cache_loc = table[batch.req_pool_indices[:, None], positions].flatten().long()
        batch.spec_info = NgramVerifyInput(
            draft_token=batch.input_ids,
            custom_mask=mask,
            positions=positions.flatten(),
            retrieve_index=retrieve,
            retrieve_next_token=nxt,
            retrieve_next_sibling=sibling,
            draft_token_num=n,
        )

    def _chain(self, bs: int) -> tuple[Tensor, Tensor | None, Tensor, Tensor, Tensor]:
        """What a chain verify of ``bs`` requests feeds SGLang besides its ids and positions,
        the same every forward (read, never written, by the forward): slot offsets j ``[n]``,
        the CPU backend's mask (None elsewhere), the chain's links ``[bs, n]`` (next, sibling)
        and each slot's flat index ``[bs, n]``."""
        cached = self._chains.get(bs)
        if cached is None:
            n, device = self.draft_token_num, self.device
            j = torch.arange(n, device=device)
            cpu = str(device).startswith("cpu")
            chain = (j[:, None] >= j[None, :]).expand(bs, n, n).flatten() if cpu else None
            nxt = torch.where(j + 1 < n, j + 1, -1).expand(bs, n).contiguous()
            retrieve = torch.arange(bs, device=device)[:, None] * n + j
            cached = (j, chain, nxt, torch.full_like(nxt, -1), retrieve)
            self._chains[bs] = cached
        return cached

    def _decode(self, batch: Any, on_publish: Any, pp_proxy_tensors: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

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

        device = logits.device
        accept_lens = result.count.to(torch.int32)
        tokens = torch.zeros(bs, n, dtype=torch.int32, device=device)
        tokens[:, : result.tokens.shape[1]] = result.tokens.to(torch.int32)
        # A chain keeps slots 0..L, the front of each window (``result.keep``): their KV is
        # already where SGLang's move of accepted tokens (move_accept_tokens_to_target_kvcache,
        # for trees) would copy it, so there is nothing to move.
        new_seq_lens = batch.seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        assert self.rows is not None
        self.rows.write(batch.req_pool_indices, result.state)
        self.forwards += bs
        self._decode_tokens += result.count.sum()
        batch.forward_mode = ForwardMode.DECODE
        next_ids = tokens.flatten()
        clock = self.clock.setdefault(bs, [0, 0.0, 0.0])
        clock[0] += 1
        clock[1] += model_s
        clock[2] += time.perf_counter() - started
        return batch_result(
            lo,
            next_ids,
            next_ids,
            accept_lens,
            new_seq_lens,
            n,
            out.can_run_cuda_graph,
        )

    def forward_batch_generation(
        self, batch: Any, on_publish: Any = None, pp_proxy_tensors: Any = None
    ) -> Any:
        if batch.forward_mode.is_decode():
            return self._decode(batch, on_publish, pp_proxy_tensors)
        if batch.forward_mode.is_extend():
            result = self._prefill(batch, pp_proxy_tensors)
            if on_publish is not None:
                on_publish(result.new_seq_lens)
            return result
        return self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)


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


def _commits_prefill(req: Any) -> bool:
    """Whether SGLang keeps this extend's token for ``req``: its prompt's last chunk
    (``inflight_middle_chunks`` counts the chunks still before it), not finished meanwhile
    (a refused request) nor retracted."""
    return (
        getattr(req, "inflight_middle_chunks", 0) <= 0
        and not req.finished()
        and not getattr(req, "is_retracted", False)
    )


def _pool_indices_cpu(batch: Any) -> Tensor:
    """The batch's request-pool indices on the host: SGLang keeps a CPU copy beside the device
    tensor; a batch without it pays one transfer."""
    index = getattr(batch, "req_pool_indices_cpu", None)
    return index if index is not None else batch.req_pool_indices.cpu()


def _one_greedy_token(params: Any) -> bool:
    greedy = float(getattr(params, "temperature", 1.0)) == 0 or getattr(params, "top_k", -1) == 1
    return greedy and getattr(params, "max_new_tokens", None) == 1


def verify_attention(
    original: Any,
    self: Any,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layer: Any,
    forward_batch: Any,
    save_kv_cache: bool = True,
) -> Any:
    """``TorchNativeAttnBackend.forward_extend`` for TARGET_VERIFY (AROUND hook).

    SGLang builds a verify batch like a decode one (no ``extend_prefix_lens`` /
    ``extend_seq_lens``; ``seq_lens`` without the n verify slots) and then routes it to
    ``forward_extend``. Plain self-attention layers (Qwen3's) write the verify slots' K/V as
    ``forward_extend`` does and attend by :func:`chain_attention`; any other layer runs
    ``forward_extend`` itself with each request's prefix its ``seq_len``, its extend n and its KV
    length ``seq_len + n``, where SDPA's causal mask is exactly the chain's.
    """
    if not forward_batch.forward_mode.is_target_verify():
        return original(self, q, k, v, layer, forward_batch, save_kv_cache)
    seq_lens = forward_batch.seq_lens
    n = q.shape[0] // seq_lens.shape[0]
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    plain = (
        not layer.is_cross_attention
        and layer.attn_type != AttentionType.ENCODER_ONLY
        and getattr(layer, "sliding_window_size", None) in (None, -1)
        and layer.qk_head_dim == layer.v_head_dim
        and forward_batch.encoder_lens is None
        and getattr(self, "swa_out_cache_loc", None) is None
        and forward_batch.seq_lens_cpu is not None
    )
    if plain:
        pool = self.token_to_kv_pool
        if save_kv_cache and k is not None and v is not None:
            pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        layout = getattr(forward_batch, "brisk_chain_layout", None)
        if layout is None:  # the first layer of this forward; the others share it
            width = int(forward_batch.seq_lens_cpu.max()) + n
            slots = self.req_to_token_pool.req_to_token[forward_batch.req_pool_indices, :width]
            layout = chain_layout(slots, seq_lens, n, width)
            forward_batch.brisk_chain_layout = layout
        out = chain_attention(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
            pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id),
            layout,
            layer.scaling,
        )
        return out.reshape(q.shape[0], -1)
    saved = (
        forward_batch.seq_lens,
        forward_batch.extend_prefix_lens,
        forward_batch.extend_seq_lens,
    )
    forward_batch.extend_prefix_lens = seq_lens
    forward_batch.extend_seq_lens = torch.full_like(seq_lens, n)
    forward_batch.seq_lens = seq_lens + n
    try:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache)
    finally:
        (
            forward_batch.seq_lens,
            forward_batch.extend_prefix_lens,
            forward_batch.extend_seq_lens,
        ) = saved


def batch_result(
    logits_output: Any,
    next_ids: Tensor,
    accept_tokens: Tensor,
    accept_lens: Tensor,
    new_seq_lens: Tensor,
    n: int,
    can_run_cuda_graph: bool,
) -> Any:
    """What a verify (or prefill) forward hands SGLang's scheduler: the committed tokens, the
    accept lengths and the new sequence lengths, as a chain verify of width ``n`` reports them
    (both brisk algorithms, ISD and the hosted drafter)."""
    from sglang.srt.managers.scheduler import GenerationBatchResult
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=next_ids,
        can_run_cuda_graph=can_run_cuda_graph,
        accept_lens=accept_lens,
        new_seq_lens=new_seq_lens,
        next_draft_input=NgramVerifyInput(
            draft_token_num=n,
            new_seq_lens=new_seq_lens,
            accept_tokens=accept_tokens,
            accept_lens=accept_lens,
        ),
        speculative_num_draft_tokens=n,
    )
