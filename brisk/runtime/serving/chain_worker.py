"""What brisk's two SGLang algorithms share: a chain speculator without SGLang draft KV.

``BRISK_ISD`` (:class:`~brisk.runtime.serving.worker.BriskISDWorker`) and ``BRISK_DRAFTER``
(:class:`~brisk.runtime.serving.drafter_worker.BriskDrafterWorker`) verify one chain of n slots
per request (``[pending, …]`` at positions ``seq_len + j``) in one forward of the target, as
SGLang's NGRAM does, and commit L + 1 tokens. :class:`ChainSpec` is their entry in SGLang's
dispatch. :class:`ChainWorker` attaches to the target's runner and pools, refuses at a request's
prefill what exact verification cannot serve, builds the chain verify's input, hands SGLang
each forward's result (:func:`batch_result`), and keeps the server's TPF (committed tokens ÷
request-forwards, prefills included; a last round's tokens past a request's budget count) and
the decode forwards' clock, logged whenever the worker falls idle.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_registry import CustomSpecAlgo
from torch import Tensor

from brisk.runtime.serving.chain import verify_mask
from brisk.runtime.serving.common import validate_sampling
from brisk.runtime.serving.options import ServedOptions

__all__ = ["ChainSpec", "ChainWorker", "batch_result", "commits_prefill", "pool_indices_cpu"]


class ChainSpec(CustomSpecAlgo):
    """A brisk algorithm for SGLang's dispatch: a no-draft-model chain speculator, so it takes
    the scheduler's NGRAM paths (``is_ngram``: no draft KV, verify-only forwards) and supplies
    the methods ``CustomSpecAlgo`` lacks in 0.5.23."""

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


class ChainWorker(BaseSpecWorker):
    """The speculative worker of a chain verify (module docstring). Like ``NGRAMWorker`` it has
    no draft model of SGLang's; it shares the target's memory pools. A subclass sets
    ``options`` and supplies the prefill (``_prefill``) and the decode round (``_decode``)."""

    algorithm: ClassVar[str]  # SGLang's name of the algorithm
    options_type: ClassVar[type[ServedOptions]]  # read from the served model's config
    log: ClassVar[logging.Logger]  # SGLang's handlers print it: sglang.srt.speculative.<name>
    options: ServedOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.log = logging.getLogger(f"sglang.srt.speculative.{cls.algorithm.lower()}")

    def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
        """SGLang's constructor of a speculative worker: the chain verify's state
        (:meth:`_chain_state`), the plugin's options (:attr:`options_type`, from the served
        model's config) and then the subclass's own (:meth:`_setup`)."""
        self._chain_state(server_args, target_worker)
        self.options = self.options_type.of_model(self.model_runner.model_config.hf_config)
        self._setup()

    def _setup(self) -> None:
        """The subclass's own state, built after :attr:`options` is read."""
        raise NotImplementedError

    def _chain_state(self, server_args: Any, target_worker: Any) -> None:
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
        self.vocab = int(self.model_runner.model_config.vocab_size)
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

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        """When the last request of the decode finishes (those that finish at the prefill
        never decode; aborted ones finish here too) the worker is idle (:meth:`_idle`)."""
        self._running -= 1
        if self._running <= 0:
            self._idle()

    def _idle(self) -> None:
        """Log the server's TPF so far."""
        self.log.info(
            "%s TPF %.3f: %d committed tokens in %d request-forwards since start "
            "(each request's prefill included)",
            self.algorithm,
            self.tpf,
            self.tokens,
            self.forwards,
        )

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

    # -- prefill: plain extend; the first token drawn as brisk's loops draw it
    def _seed(self, req: Any) -> int:
        seed = getattr(req.sampling_params, "sampling_seed", None)
        return int(seed) if seed is not None else self.options.seed

    def _refuse(self, batch: Any) -> list[bool]:
        """Abort, at their prefill, the requests whose sampling the verifier cannot serve
        exactly at the server's temperature (:func:`~brisk.runtime.serving.common.
        validate_sampling`) or that ask for logprobs; returns which rows are greedy requests
        for one token, served exactly by the prefill's argmax whatever the server's temperature
        (SGLang's ``/health_generate`` asks for one)."""
        argmax_rows = [_one_greedy_token(r.sampling_params) for r in batch.reqs]
        T = self.options.temperature
        for req, argmax in zip(batch.reqs, argmax_rows, strict=True):
            why = None if argmax else validate_sampling(req.sampling_params, T, self.algorithm)
            if why is None and getattr(req, "return_logprob", False):
                why = f"{self.algorithm} does not return logprobs"
            if why is not None and not req.finished():
                req.set_finish_with_abort(why)
        return argmax_rows

    def _prefill_result(self, batch: Any, result: Any, first: Tensor, committed: int) -> Any:
        """SGLang's result of a prefill that drew each request's first token ``first [bs]``
        (kept for the ``committed`` requests whose prompt it ends: :func:`commits_prefill`):
        one token each, the sequence lengths unchanged (the next forward feeds it)."""
        self.forwards += committed
        self._prefill_tokens += committed
        bs, n = len(batch.reqs), self.draft_token_num
        accept_tokens = torch.zeros(bs, n, dtype=torch.int32, device=first.device)
        accept_tokens[:, 0] = first
        accept_lens = torch.ones(bs, dtype=torch.int32, device=first.device)
        lo, graph = result.logits_output, result.can_run_cuda_graph
        flat = accept_tokens.flatten()
        return batch_result(lo, first, flat, accept_lens, batch.seq_lens.clone(), n, graph)

    # -- decode: one chain verify per request
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

    def _decode_result(
        self, batch: Any, out: Any, tokens: Tensor, accept_lens: Tensor, on_publish: Any
    ) -> Any:
        """SGLang's result of a chain verify that committed ``accept_lens [bs]`` tokens per
        request, ``tokens [bs, n]`` (junk past them): the sequences grow by them (published
        first), and the forward counts toward the TPF. A chain keeps slots 0..L, the front of
        each window: their KV is already where SGLang's move of accepted tokens
        (move_accept_tokens_to_target_kvcache, for trees) would copy it, so nothing moves."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        new_seq_lens = batch.seq_lens + accept_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.forwards += len(batch.reqs)
        self._decode_tokens += accept_lens.sum()
        batch.forward_mode = ForwardMode.DECODE
        next_ids = tokens.flatten()
        n = self.draft_token_num
        return batch_result(
            out.logits_output,
            next_ids,
            next_ids,
            accept_lens,
            new_seq_lens,
            n,
            out.can_run_cuda_graph,
        )

    def _prefill(self, batch: Any, pp_proxy_tensors: Any) -> Any:
        raise NotImplementedError

    def _decode(self, batch: Any, on_publish: Any, pp_proxy_tensors: Any) -> Any:
        raise NotImplementedError

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


def commits_prefill(req: Any) -> bool:
    """Whether SGLang keeps this extend's token for ``req``: its prompt's last chunk
    (``inflight_middle_chunks`` counts the chunks still before it), not finished meanwhile
    (a refused request) nor retracted."""
    return (
        getattr(req, "inflight_middle_chunks", 0) <= 0
        and not req.finished()
        and not getattr(req, "is_retracted", False)
    )


def pool_indices_cpu(batch: Any) -> Tensor:
    """The batch's request-pool indices on the host: SGLang keeps a CPU copy beside the device
    tensor; a batch without it pays one transfer."""
    index = getattr(batch, "req_pool_indices_cpu", None)
    return index if index is not None else batch.req_pool_indices.cpu()


def _one_greedy_token(params: Any) -> bool:
    greedy = float(getattr(params, "temperature", 1.0)) == 0 or getattr(params, "top_k", -1) == 1
    return greedy and getattr(params, "max_new_tokens", None) == 1


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
