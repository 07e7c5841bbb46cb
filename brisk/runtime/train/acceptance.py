"""Acceptance of a training batch's own proposals under the ISD rule, and the position weights.

One I-DLM forward gives, at every MASK slot ``j`` of block ``b``, the proposal law q_j (noisy
stream) and the verifier law p_j (clean stream) of the same token ``x_0[j + 1]``, both
conditioned on the data prefix (see :mod:`brisk.runtime.train.idlm`): slot ``i − 1`` of a block
is proposal position ``i``. ISD at temperature T drafts from q_j restricted to its Top-K and
accepts with probability min(1, p/q), so given the prefix the acceptance probability of position
i is the overlap

    β_i = Σ_v min(p_i(v), q_i^K(v))          (greedy: β_i = 1[argmax q_i = argmax p_i]).

:func:`block_acceptance` draws each position's verdict 1[u_i < β_i] with counter-based uniforms
keyed by (seed, example, block), so a draw does not depend on how a batch is split across
processes, and applies the ISD verification rule: the accepted prefix length L is the number of
leading acceptances and positions after the first rejection are not reached. Only *complete*
blocks (all M positions inside the response) are counted. The counts feed
:class:`brisk.theory.ProfileTracker`, whose rates give the BRISK weights (eq:brisk_weighting).

:func:`position_weights` gives the loss weights ``[n_blocks, M]`` of every scheme: BRISK
(progress weights of a profile), uniform, D-PACE (from the drafter's probability of each target
token, per block) and DFlash's decay. All are constants in backprop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from brisk.runtime.sampling import counter_uniforms
from brisk.runtime.train.idlm import IGNORE, IDLMBatch
from brisk.runtime.train.proposal_config import WeightScheme
from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    decay_weights,
    dpace_weights,
    progress_weights,
)

__all__ = [
    "BlockAcceptance",
    "Weighting",
    "acceptance_from_beta",
    "block_acceptance",
    "position_weights",
    "slot_table",
]

Weighting = WeightScheme


@dataclass(frozen=True)
class SlotTable:
    """The MASK slots of a batch arranged by block: ``index[b, k, i]`` is the sequence position
    of proposal position i + 1 of row b's k-th block (−1 where the block has no such slot)."""

    index: Tensor  # [B, K, M] long
    complete: Tensor  # [B, K] bool: all M slots have a label inside the response


def slot_table(batch: IDLMBatch) -> SlotTable:
    """Blocks of each row from the batch's block layout (offset and M)."""
    B, L, M = batch.noisy_labels.shape[0], batch.L, batch.M
    labelled = batch.noisy_labels != IGNORE  # [B, L]
    start = batch.block_start  # [L]
    # Block k of the layout starts at first_start + k·M; its slots are start + 0..M−1.
    first = int(start[0])
    n_blocks = (L - first + M - 1) // M
    pos = first + torch.arange(n_blocks, device=start.device)[:, None] * M
    pos = pos + torch.arange(M, device=start.device)[None]  # [K, M]
    inside = (pos >= 0) & (pos < L)
    safe = pos.clamp(0, L - 1)
    has = labelled[:, safe] & inside[None]  # [B, K, M]
    index = torch.where(has, safe[None].expand(B, -1, -1), -1)
    return SlotTable(index=index, complete=has.all(-1))


@dataclass(frozen=True)
class BlockAcceptance:
    """ISD verdicts on the complete blocks of a batch."""

    beta: Tensor  # [n, M] float32 acceptance probability of each position given the prefix
    accept_len: Tensor  # [n] long, L ∈ 0..M
    rows: Tensor  # [n] the batch row of each block
    blocks: Tensor  # [n] the block's index within its row

    @property
    def M(self) -> int:
        return int(self.beta.shape[1])

    def profile(self) -> AcceptanceProfile:
        return AcceptanceProfile.from_accept_lengths(self.accept_len.cpu().numpy(), self.M)


@torch.no_grad()
def block_acceptance(
    noisy_logits: Tensor,
    clean_logits: Tensor,
    table: SlotTable,
    example_ids: Tensor,
    seed: int,
    temperature: float = 1.0,
    top_k: int = 16,
) -> BlockAcceptance:
    """Draw the ISD verdict of every complete block (module docstring) from the two streams'
    logits ``[B, L, V]``. β is computed a few blocks at a time in float32
    (:func:`~brisk.runtime.train.vocab.acceptance_probability`: p's logsumexp and a K-wide
    gather), never as an ``[n, M, V]`` float64 tensor; training loops pass the β their chunked
    losses computed to :func:`acceptance_from_beta` instead.

    ``example_ids [B]`` identify the rows globally (the uniforms of block k of example e are
    ``counter_uniforms(seed, e, k)``), so the same example gets the same draws whichever process
    or batch position holds it.
    """
    from brisk.runtime.train.vocab import CHUNK_ELEMENTS, acceptance_probability

    beta = torch.zeros(noisy_logits.shape[:2], device=noisy_logits.device)
    rows, blocks = table.complete.nonzero(as_tuple=True)
    pos = table.index[rows, blocks]  # [n, M]
    step = max(1, CHUNK_ELEMENTS // (pos.shape[1] * noisy_logits.shape[-1]))
    for s in range(0, len(rows), step):
        r, j = rows[s : s + step, None].expand_as(pos[s : s + step]), pos[s : s + step]
        beta[r, j] = acceptance_probability(noisy_logits[r, j], clean_logits[r, j], temperature,
                                            top_k).float()  # fmt: skip
    return acceptance_from_beta(beta, table, example_ids, seed)


@torch.no_grad()
def acceptance_from_beta(
    beta: Tensor, table: SlotTable, example_ids: Tensor, seed: int
) -> BlockAcceptance:
    """The verdicts of :func:`block_acceptance` from each MASK slot's acceptance probability
    ``beta [B, L]`` (:func:`brisk.runtime.train.vocab.stream_losses` computes it with the
    losses)."""
    rows, blocks = table.complete.nonzero(as_tuple=True)
    M = table.index.shape[-1]
    if not len(rows):
        empty = torch.zeros(0, dtype=torch.long)
        return BlockAcceptance(torch.zeros(0, M), empty, empty, empty)
    pos = table.index[rows, blocks]  # [n, M]
    b = beta[rows[:, None], pos]
    u = counter_uniforms(
        torch.full_like(rows, seed), example_ids.to(rows.device)[rows], blocks, M
    ).to(b.device)
    accept_len = (u < b).long().cumprod(-1).sum(-1)
    return BlockAcceptance(b.cpu(), accept_len.cpu(), rows.cpu(), blocks.cpu())


def position_weights(
    scheme: Weighting,
    M: int,
    *,
    rates: np.ndarray | None = None,
    target_probs: Tensor | None = None,
    gamma: float = 7.0,
) -> Tensor:
    """Loss weights ``[n, M]`` (``[1, M]`` for schemes shared by every block), float32, mean one.

    - ``brisk``: progress_weights(rates) with the ISD cost model (``rates [M]``, no NaN);
    - ``uniform``: all ones;
    - ``dpace``: D-PACE from the drafter's probability of each target token,
      ``target_probs [n, M]`` (per block);
    - ``decay``: exp(−(k − 1)/γ), normalized.
    """
    if scheme == "brisk":
        if rates is None or np.isnan(rates).any():
            raise ValueError(f"rates: BRISK weights need a complete profile, got {rates!r}")
        w = progress_weights(np.asarray(rates, float), CostModel.isd(M))
    elif scheme == "uniform":
        w = np.ones(M)
    elif scheme == "decay":
        w = decay_weights(M, gamma)
    elif scheme == "dpace":
        if target_probs is None:
            raise ValueError("target_probs: D-PACE weights need the drafter's target probabilities")
        return dpace_weights(target_probs.detach().double().clamp(0, 1)).float()
    else:
        raise ValueError(f"weights: expected brisk, uniform, dpace or decay, got {scheme!r}")
    return torch.as_tensor(np.asarray(w), dtype=torch.float32)[None]
