"""The corrector over DFlash's Top-K draft candidates: AROUND hooks on its draft sampler.

DFlash drafts a block of ``block_size`` slots (the anchor token, then MASK slots) with its draft
model and picks each MASK slot's token greedily through the target's LM head
(``DFlashWorkerV2._greedy_sample_from_vocab_parallel_head``; under CUDA graphs a captured
sampler from ``_maybe_build_draft_sampler``). With ``BRISK_DFLASH_CORRECTOR`` naming a corrector
checkpoint, :func:`rerank` replaces that choice: C_j = the Top-K of the draft logits, and the
head picks over C_j left to right, each pick conditioned on the previous one
(:meth:`brisk.runtime.corrector.Corrector.select`, greedy). :func:`eager_when_reranking` keeps
the sampler eager so the hook runs on every draft.

Exactness: the reranked block is a deterministic function of the draft's state, a point-mass
proposal law, which DFlash's verification (draft token against the target's argmax, or against
its sample) is already exact for; no other law needs handing over.

The sampler sees the MASK slots' hidden states, not the anchor slot's, so the head's anchor
term gets the anchor token's embedding and a zero hidden state. brisk's speculative loop
(:func:`brisk.runtime.drafter.speculative_decode`) drafts with a head the same way and records
its training events the same way (``brisk train corrector collect --checkpoint TARGET
--drafter DRAFTER``), so a head ``brisk train corrector`` trains on them is the head this hook
loads, and it picks here what it picks in brisk's loop from the same hidden states.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.backbone import ModelHeads
from brisk.runtime.corrector import Corrector, CorrectorInputs

__all__ = ["ENV", "eager_when_reranking", "rerank", "reranker"]

ENV = "BRISK_DFLASH_CORRECTOR"
log = logging.getLogger(__name__)
_loaded: dict[str, Corrector] = {}


def reranker(worker: Any) -> Corrector | None:
    """The worker's corrector: its ``brisk_corrector`` attribute, else ``$BRISK_DFLASH_CORRECTOR``
    (loaded once per process), else None (DFlash's own sampler runs)."""
    head = getattr(worker, "brisk_corrector", None)
    if head is not None:
        return head  # type: ignore[no-any-return]
    path = os.environ.get(ENV)
    if not path:
        return None
    if path not in _loaded:
        _loaded[path] = Corrector.from_pretrained(path)
        log.info("brisk: DFlash drafts reranked by the corrector at %s", path)
    return _loaded[path]


def eager_when_reranking(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """No captured draft sampler while the corrector reranks (it runs in the eager sampler)."""
    if reranker(self) is not None:
        return None
    return original(self, *args, **kwargs)


def rerank(
    original: Any, self: Any, *, hidden_states: Tensor, lm_head: Any, chunk_size: int = 256
) -> Tensor:
    """Draft tokens ``[bs · (block_size − 1)]`` for the MASK slots' ``hidden_states``: the
    corrector's greedy pick over the Top-K of ``hidden_states @ lm_head.weight.T``."""
    head = reranker(self)
    if head is None or hidden_states.numel() == 0:
        return original(
            self,
            hidden_states=hidden_states,
            lm_head=lm_head,  # type: ignore[no-any-return]
            chunk_size=chunk_size,
        )
    weight = getattr(lm_head, "weight", None)
    if (hasattr(lm_head, "shard_indices") and _tp_size() > 1) or not _dense(weight):
        _warn_once(
            "brisk: DFlash reranking needs one dense, unsharded LM head (tensor parallelism "
            "1, no quantized head); drafting with DFlash's own sampler"
        )
        return original(
            self,
            hidden_states=hidden_states,
            lm_head=lm_head,  # type: ignore[no-any-return]
            chunk_size=chunk_size,
        )
    M = int(self.block_size) - 1
    if head.config.M != M:
        raise ValueError(
            f"{ENV}: the corrector was built for M = {head.config.M}, DFlash drafts "
            f"{M} positions (block_size {self.block_size})"
        )
    assert weight is not None
    heads = _heads(self, head, weight.device)
    bs = hidden_states.shape[0] // M
    mask_hidden = hidden_states.view(bs, M, -1)
    logits = (mask_hidden.to(weight.dtype) @ weight.T)[..., : heads.vocab_size]  # no padding rows
    cand_logits, cand_ids = logits.float().topk(head.config.K, dim=-1)
    anchor = self._draft_block_ids_buf[:bs, 0]
    anchor_hidden = torch.zeros_like(mask_hidden[:, 0])
    block = CorrectorInputs(anchor_hidden, anchor, mask_hidden, cand_logits, cand_ids)
    sel = head.select(heads, block, 0.0)  # type: ignore[arg-type]
    return sel.tokens.reshape(-1).to(torch.long)


def _heads(worker: Any, head: Corrector, device: torch.device) -> ModelHeads:
    """The target's E / E_out for the head, built once per worker (the head's folded tables are
    cached against it), with the head moved to the device once."""
    cached = getattr(worker, "_brisk_heads", None)
    if cached is not None and cached[0] is head:
        return cached[1]
    runner = worker.target_worker.model_runner
    vocab = getattr(getattr(runner, "model_config", None), "vocab_size", None)
    heads = ModelHeads(runner.model, vocab_size=vocab)
    head.to(device)
    worker._brisk_heads = (head, heads)
    return heads


def _dense(weight: Any) -> bool:
    return isinstance(weight, Tensor) and weight.dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    )


def _tp_size() -> int:
    try:
        from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_world_size())
    except Exception:  # outside SGLang's process groups: one rank
        return 1


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)
