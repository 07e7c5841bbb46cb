"""``BriskISD``: SGLang's ``DllmAlgorithm`` for ISD with exact verification and the corrector.

One ``run`` is one forward of the batch, each request a row of brisk's batched step
(:func:`brisk.runtime.isd.batched.step`) and its ISD state carried by SGLang in the request's
``dllm_algo_state`` between forwards. SGLang's block is the I-DLM round of 2N − 1 slots:

- verify round ``[pending, x_1..x_M, MASK×M]``; cold start ``[pending, MASK×M, MASK×M]`` (the
  trailing MASKs only pad: attention in the block is causal, so slots 0..M never see them);
- the logit at slot t predicts the token after slot t: p_1..p_{M+1} verify the block and give the
  bonus, the MASK slots propose the next block (q restricted to its Top-K, or the corrector).

The contract with the scheduler, per request and forward (``run``'s return):

- ``next_token_ids_list[i]``: the committed tokens, L + 1 of them (accepted x_1..x_L and the
  correction or bonus; one after a cold start). Stops (EOS, max tokens, stop strings) are the
  scheduler's: the algorithm never cuts;
- ``accept_length_per_req[i]``: how many of the block's slots keep their KV, from slot 0 on
  (pending and the accepted drafts, L + 1; 1 after a cold start). The last committed token is
  the next forward's pending, at slot 0, so its KV is written then;
- ``states[i]``: the request's :class:`RowHandle` (its row of this forward's batch state), to
  be handed back with its next forward; a request's first forward gets ``None`` and its slot 0
  holds the pending token (the prompt's last one: prefill leaves it out of the KV cache). An
  unchanged batch reuses the previous state as it is; a changed one costs one row selection per
  source batch, not per request.

The scheduler side of this contract (variable-length commits, the block placed at the request's
KV length, KV kept for ``accept_length`` slots) is what the I-DLM fork overrides in SGLang; 0.5.23
commits whole blocks, so ``configure_server_args`` refuses to start a server whose scheduler does
not declare it (``SUPPORTS_VARIABLE_COMMIT``), with that message. The algorithm itself is tested
against brisk's reference ISD through a model runner that honours the contract
(``tests/serving``).

Uniforms are :func:`~brisk.runtime.sampling.counter_uniforms` of (the request's sampling seed,
which SGLang fills under ``--enable-deterministic-inference``, else the config's ``seed``; its
:func:`request_key`, a hash of its rid; its forward counter; slot), so a request's tokens do not
depend on the batch it runs in.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import weakref
from typing import Any

import torch
from sglang.srt.dllm.algorithm.base import DllmAlgorithm
from sglang.srt.dllm.config import DllmConfig
from torch import Tensor

from brisk.runtime.blocklog import BlockLogger, verification_for
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd.batched import ISDState, StepContext, init_state, step
from brisk.runtime.isd.loop import log_verified
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.serving.options import BriskISDOptions, OptionError

__all__ = ["BriskISD", "ModelHeads", "RowHandle", "request_key", "validate_sampling"]

_TEMPERATURES: dict[str, float] = {}


class ModelHeads:
    """What the corrector reads of the served model: E (input embeddings) and E_out (LM head
    rows), for a Qwen3-layout ``model`` (``model.model.embed_tokens``, ``model.lm_head``), which
    SGLang's and transformers' modules share."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None) -> None:
        inner = getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        head = getattr(model, "lm_head", None)
        if embed is None or head is None or not hasattr(head, "weight"):
            raise RuntimeError(
                "corrector: the served model has no model.embed_tokens / lm_head.weight "
                f"(a Qwen3-layout model is needed), got {type(model).__name__}"
            )
        if hasattr(head, "shard_indices") and head.weight.shape[0] < (vocab_size or 0):
            raise RuntimeError(
                "corrector: the LM head is sharded across tensor-parallel ranks; the head needs "
                "the whole vocabulary (tensor parallelism 1)"
            )
        self._embed, self._head = embed, head
        # SGLang pads the head's rows; the model's vocabulary is the unpadded size
        self.vocab_size = int(vocab_size) if vocab_size else int(head.weight.shape[0])
        self.hidden_size = int(head.weight.shape[1])
        self.device = head.weight.device

    def embed(self, ids: Tensor) -> Tensor:
        return self._embed(ids)  # type: ignore[no-any-return]

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        return self._head.weight[ids]  # type: ignore[no-any-return]


def validate_sampling(params: Any, temperature: float) -> str | None:
    """Why a request's sampling parameters cannot be served at ``temperature`` (or None).

    ISD is exact for plain sampling from p at the server's temperature (greedy: its argmax);
    truncation (top-k, top-p, min-p), penalties and logit processors change p per request and
    are not part of verification."""
    t = float(getattr(params, "temperature", 1.0))
    top_k = int(getattr(params, "top_k", -1))
    greedy = t == 0 or top_k == 1
    if (temperature == 0) != greedy or (not greedy and abs(t - temperature) > 1e-6):
        asked = "greedy" if greedy else f"temperature {t}"
        served = "greedy" if temperature == 0 else f"temperature {temperature}"
        return f"BriskISD serves {served} (its algorithm config); this request asks for {asked}"
    if not greedy:
        for name, neutral in (("top_k", -1), ("top_p", 1.0), ("min_p", 0.0)):
            if getattr(params, name, neutral) not in (neutral, None) and not (
                name == "top_k" and getattr(params, name) >= (1 << 30)
            ):
                return f"BriskISD verifies plain sampling from p: {name} is not supported"
    for name in ("json_schema", "regex", "ebnf", "structural_tag", "logit_bias"):  # fmt: skip
        if getattr(params, name, None):
            return f"BriskISD verifies against the model's p: {name} is not supported"
    if getattr(params, "min_new_tokens", 0):
        return "BriskISD verifies against the model's p: min_new_tokens is not supported"
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(params, name, 0.0) not in (0.0, None):
            return f"BriskISD verifies against the model's p: {name} is not supported"
    if getattr(params, "repetition_penalty", 1.0) not in (1.0, None):
        return "BriskISD verifies against the model's p: repetition_penalty is not supported"
    return None


class BriskISD(DllmAlgorithm):
    """ISD (+ corrector) through brisk's batched step; module doc for the scheduler contract."""

    supported_architectures: tuple[str, ...] = ()  # admitted by brisk's DllmConfig hook

    def __init__(self, config: DllmConfig) -> None:
        super().__init__(config)
        # SGLang hands a request's dllm_algo_state to run() only in FDFO mode
        self.fdfo = True
        self.options = BriskISDOptions.from_mapping(config.algorithm_config)
        if self.block_size != self.options.block_size:
            raise OptionError(
                f"block_size: {self.block_size} from SGLang, BriskISD needs 2N − 1 = "
                f"{self.options.block_size} at stride {self.options.stride}"
            )
        opt = self.options
        self.corrector = Corrector.from_pretrained(opt.corrector) if opt.corrector else None
        if self.corrector is not None:
            self.corrector.impl = opt.impl
            if self.corrector.config.M != opt.M:
                raise OptionError(
                    f"corrector: built for M = {self.corrector.config.M}, stride "
                    f"{opt.stride} gives M = {opt.M}"
                )
        K = self.corrector.config.K if self.corrector is not None else opt.top_k
        self.isd = ISDOptions(stride=opt.stride, temperature=opt.temperature, shadow=opt.shadow,
                              top_k=K)  # fmt: skip
        self.K = K
        self.logger = _rank_logger(opt.log_blocks, opt.M, K) if opt.log_blocks else None
        if self.logger is not None:  # SGLang never closes its algorithm: flush at exit
            self.logger.declare(verification_for(self.isd, self.corrector))
            weakref.finalize(self, self.logger.close)
            atexit.register(self.logger.close)
        self._heads: ModelHeads | None = None
        self._vocab_size: int | None = None
        self.forwards = 0  # server counters: TPF = tokens / forwards
        self.tokens = 0

    @classmethod
    def configure_server_args(cls, server_args: Any) -> None:
        scheduler = _scheduler_mixin()
        if not getattr(scheduler, "SUPPORTS_VARIABLE_COMMIT", False):
            raise RuntimeError(
                "--dllm-algorithm BriskISD: this SGLang's dLLM scheduler commits whole blocks; "
                "ISD commits L + 1 tokens per forward, keeps the KV of L + 1 slots and carries "
                "its state between forwards (the I-DLM fork's scheduler overrides), which SGLang "
                "0.5.23 does not have"
            )

    @classmethod
    def validate_request(cls, req: Any) -> str | None:
        config = getattr(getattr(req, "dllm_config", None), "algorithm_config", None) or {}
        key = json.dumps(config, sort_keys=True, default=str)
        temperature = _TEMPERATURES.get(key)
        if temperature is None:  # once per config, not per request: options read files
            temperature = _TEMPERATURES[key] = BriskISDOptions.from_mapping(config).temperature
        if getattr(req, "return_logprob", False):
            return "BriskISD does not return logprobs"
        if getattr(req, "custom_logit_processor", None):
            return (
                "BriskISD verifies against the model's p: custom logit processors are not supported"
            )
        return validate_sampling(req.sampling_params, temperature)

    def close(self) -> None:
        """Flush and close the block log (atomically written row groups)."""
        if self.logger is not None:
            self.logger.close()

    # -- one forward
    def _context(self, model: torch.nn.Module) -> StepContext:
        heads = None
        if self.corrector is not None:
            if self._heads is None:
                self._heads = ModelHeads(model, self._vocab_size)
                c = self.corrector.config
                if (self._heads.hidden_size, self._heads.vocab_size) != (
                    c.hidden_size,
                    c.vocab_size,
                ):
                    raise OptionError(
                        f"corrector: trained for hidden {c.hidden_size} / vocab {c.vocab_size}, "
                        f"the served model has {self._heads.hidden_size} / "
                        f"{self._heads.vocab_size}"
                    )
                self.corrector.to(self._heads.device)
            heads = self._heads
        return StepContext(self.isd, self.K, heads, self.corrector,  # type: ignore[arg-type]
                           log=self.logger is not None)  # fmt: skip

    def _new_rows(self, forward_batch: Any, index: list[int], ctx: StepContext) -> ISDState:
        ids = forward_batch.input_ids.view(forward_batch.batch_size, self.block_size)
        device = ids.device
        idx = torch.tensor(index, device=device)
        seeds = _request_seeds(forward_batch, self.options.seed).to(device)[idx]
        keys = _request_keys(forward_batch).to(device)[idx]
        # the row starts at its pending token; its length (prompt + output so far) gives the
        # block log the offsets in the request's own sequence
        prefix = getattr(forward_batch, "extend_prefix_lens", None)
        lengths = (prefix.to(device)[idx].long() + 1 if prefix is not None
                   else torch.ones(len(index), dtype=torch.long, device=device))  # fmt: skip
        return init_state(ids[idx, 0], lengths, seeds, keys, ctx)

    def run(
        self, model_runner: Any, forward_batch: Any, algo_states: list[Any] | None = None
    ) -> tuple[Any, list[list[int]], list[int], list[Any], bool]:
        B, S = forward_batch.batch_size, self.block_size
        self._vocab_size = getattr(getattr(model_runner, "model_config", None), "vocab_size", None)
        ctx = self._context(model_runner.model)
        state = self._gather(forward_batch, algo_states, ctx)
        self.prepare_inputs(model_runner, forward_batch, [state])

        out = model_runner.forward(forward_batch, pp_proxy_tensors=None)
        lo = out.logits_output
        logits = lo.full_logits.view(B, S, -1)
        hidden = getattr(lo, "hidden_states", None)
        if hidden is None:
            if self.corrector is not None:
                raise RuntimeError(
                    "BriskISD: the corrector needs the forward's last hidden states, and this "
                    "SGLang's logits processor returns none in dLLM extend mode"
                )
            hidden = logits.new_zeros(B, S, 1)
        result = step(state, logits, hidden.view(B, S, -1), ctx)
        if self.logger is not None:
            log_verified(self.logger, state, result, logits, self.options.temperature)

        new = result.state
        committed, keep = result.committed(), result.keep.sum(1).tolist()
        self.forwards += B
        self.tokens += sum(len(c) for c in committed)
        return lo, committed, keep, [RowHandle(new, i) for i in range(B)], bool(out.can_run_graph)

    def _gather(self, forward_batch: Any, algo_states: list[Any] | None, ctx: StepContext) -> Any:
        """The batch's state from the requests' handles: the previous forward's batch itself
        when the batch is unchanged (no copy), else one row selection per source batch (and
        the fresh rows) concatenated: a handful of tensor ops per forward, never per row."""
        B = forward_batch.batch_size
        handles = list(algo_states) if algo_states is not None else [None] * B
        if len(handles) != B:
            raise ValueError(f"algo_states: {len(handles)} states for a batch of {B}")
        for h in handles:
            if h is not None and not isinstance(h, RowHandle):
                raise TypeError(f"algo_states: expected BriskISD row handles, got {type(h)}")
        first = handles[0]
        if (
            isinstance(first, RowHandle)
            and first.batch.seed.shape[0] == B
            and all(isinstance(h, RowHandle) and h.batch is first.batch and h.row == i
                    for i, h in enumerate(handles))
        ):  # fmt: skip
            return first.batch
        fresh = [i for i, h in enumerate(handles) if h is None]
        new = self._new_rows(forward_batch, fresh, ctx) if fresh else None
        # runs of consecutive rows from one source, in batch order
        parts: list[Any] = []
        i = 0
        while i < B:
            h = handles[i]
            j = i + 1
            if h is None:
                while j < B and handles[j] is None:
                    j += 1
                assert new is not None
                lo = fresh.index(i)
                src, rows = new, list(range(lo, lo + j - i))
            else:
                while j < B and isinstance(handles[j], RowHandle) and handles[j].batch is h.batch:
                    j += 1
                src, rows = h.batch, [handles[k].row for k in range(i, j)]
            parts.append(src.select(torch.tensor(rows, device=src.seed.device)))
            i = j
        return parts[0] if len(parts) == 1 else ISDState.concat(parts)

    def prepare_inputs(self, model_runner: Any, forward_batch: Any, states: list[Any]) -> None:
        """Write each row's slots into ``forward_batch.input_ids`` in place (CUDA-graph safe):
        ``[pending, x_1..x_M or MASK×M, MASK×M]``."""
        (state,) = states
        M, ids = self.options.M, forward_batch.input_ids.view(-1, self.block_size)
        slots = torch.full_like(ids, self.mask_id)
        slots[:, 0] = state.pending
        slots[:, 1 : M + 1] = torch.where(state.verify[:, None], state.draft.tokens, self.mask_id)
        ids.copy_(slots)
        if self.corrector is not None:
            _capture_hidden(forward_batch)


@dataclasses.dataclass(frozen=True)
class RowHandle:
    """A request's ISD state between forwards (SGLang's ``req.dllm_algo_state``): row ``row`` of
    the batch state ``batch`` its last forward produced."""

    batch: ISDState
    row: int


def _request_seeds(forward_batch: Any, default: int) -> Tensor:
    info = getattr(forward_batch, "sampling_info", None)
    seeds = getattr(info, "sampling_seed", None)
    if seeds is None:
        return torch.full((forward_batch.batch_size,), default, dtype=torch.long)
    return seeds.to(torch.long)


def _rank_logger(path: str, M: int, K: int) -> BlockLogger | None:
    """The block log of this process: tensor-parallel ranks see the same rows, so only TP rank
    0 logs; under torch.distributed each logging process writes its own ``rank{r}`` folder
    (``brisk mechanism report`` reads them all)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return BlockLogger(path, M, K)
    try:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_rank

        tp_rank = get_tensor_model_parallel_rank()
    except Exception:  # pragma: no cover - outside SGLang's process groups
        tp_rank = 0
    if tp_rank != 0:
        return None
    return BlockLogger(f"{path}/rank{dist.get_rank()}", M, K)


def request_key(rid: str) -> int:
    """A request's key for its uniforms: a stable 63-bit hash of SGLang's request id (``rid``),
    the same in every process and never reused by a later request (unlike a pool slot)."""
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "little") >> 1


def _request_keys(forward_batch: Any) -> Tensor:
    rids = getattr(forward_batch, "rids", None)
    if rids is None:
        raise RuntimeError("BriskISD: the forward batch carries no request ids (rids)")
    return torch.tensor([request_key(r) for r in rids], dtype=torch.long)


def _capture_hidden(forward_batch: Any) -> None:
    try:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    except ImportError:  # pragma: no cover - the plugin runs inside SGLang
        return
    forward_batch.capture_hidden_mode = CaptureHiddenMode.FULL


def _scheduler_mixin() -> Any:
    from sglang.srt.dllm.mixin.scheduler import SchedulerDllmMixin

    return SchedulerDllmMixin


Algorithm = BriskISD
