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
term gets the anchor token's embedding and a zero hidden state; a head for DFlash is trained on
events recorded the same way.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.corrector import Corrector

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
        return original(self, hidden_states=hidden_states, lm_head=lm_head,  # type: ignore[no-any-return]
                        chunk_size=chunk_size)  # fmt: skip
    from brisk.runtime.serving.algorithm import ModelHeads

    M = int(self.block_size) - 1
    if head.config.M != M:
        raise ValueError(
            f"{ENV}: the corrector was built for M = {head.config.M}, DFlash drafts "
            f"{M} positions (block_size {self.block_size})"
        )
    bs = hidden_states.shape[0] // M
    weight = lm_head.weight
    heads = ModelHeads(self.target_worker.model_runner.model)
    head.to(weight.device)
    mask_hidden = hidden_states.view(bs, M, -1)
    logits = mask_hidden.to(weight.dtype) @ weight.T  # [bs, M, V]
    cand_logits, cand_ids = logits.float().topk(head.config.K, dim=-1)
    anchor = self._draft_block_ids_buf[:bs, 0]
    anchor_hidden = torch.zeros_like(mask_hidden[:, 0])
    sel = head.select(heads, anchor_hidden, anchor, mask_hidden, cand_logits,  # type: ignore[arg-type]
                      cand_ids, 0.0)  # fmt: skip
    return sel.tokens.reshape(-1).to(torch.long)
