"""Acceptance of a training batch's own proposals under the ISD rule, and the position weights.

One I-DLM forward gives, at every MASK slot ``j`` of block ``b``, the proposal law q_j (noisy
stream) and the verifier law p_j (clean stream) of the same token ``x_0[j + 1]``, both
conditioned on the data prefix (see :mod:`brisk.runtime.train.idlm`): slot ``i − 1`` of a block
is proposal position ``i``. ISD at temperature T drafts from q_j restricted to its Top-K and
accepts with probability min(1, p/q), so given the prefix the acceptance probability of position
i is the overlap

    β_i = Σ_v min(p_i(v), q_i^K(v))          (greedy: β_i = 1[argmax q_i = argmax p_i]).

:func:`acceptance_from_beta` draws each position's verdict 1[u_i < β_i] from the β the training
forward computes with its losses (:func:`brisk.runtime.train.vocab.stream_losses`, a few rows
at a time, never an ``[n, M, V]`` tensor) with counter-based uniforms keyed by (seed, example,
block), so a draw does not depend on how a batch is split across processes, and applies the
ISD verification rule: the accepted prefix length L is the number of
leading acceptances and positions after the first rejection are not reached. Only *complete*
blocks (all M positions inside the response) are counted. The counts feed
:class:`brisk.theory.ProfileTracker`, whose rates give the BRISK weights (eq:brisk_weighting).

:func:`position_weights` gives the loss weights ``[n_blocks, M]`` of every scheme: BRISK
(progress weights of a profile), uniform, D-PACE (from the drafter's probability of each target
token, per block) and DFlash's decay. All are constants in backprop. For a proposal-training
batch, :func:`acceptance_histogram`, :func:`upcoming_profile` and :func:`token_weights` turn its
acceptance into the profile and the per-token weights of the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from brisk.runtime.sampling import counter_uniforms
from brisk.runtime.train.common import scheme_weights
from brisk.runtime.train.idlm import IGNORE, IDLMBatch, auto_alpha
from brisk.runtime.train.proposal.config import ProposalTrainConfig, WeightScheme
from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
)

__all__ = [
    "BlockAcceptance",
    "Weighting",
    "acceptance_from_beta",
    "acceptance_histogram",
    "position_weights",
    "profile_counts",
    "slot_table",
    "slot_weight_sums",
    "token_weights",
    "upcoming_profile",
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
def acceptance_from_beta(
    beta: Tensor, table: SlotTable, example_ids: Tensor, seed: int
) -> BlockAcceptance:
    """The ISD verdict of every complete block (module docstring) from each MASK slot's
    acceptance probability ``beta [B, L]`` (:func:`brisk.runtime.train.vocab.stream_losses`
    computes it with the losses). ``example_ids [B]`` identify the rows globally (the uniforms
    of block k of example e are ``counter_uniforms(seed, e, k)``), so the same example gets the
    same draws whichever process or batch position holds it."""
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
    a = None if rates is None else np.asarray(rates, float)
    w = scheme_weights(scheme, M, CostModel.isd(M), rates=a, token_probs=target_probs, gamma=gamma)
    return w.float() if scheme == "dpace" else w.float()[None]


def profile_counts(hist: Tensor, M: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reached/accepted counts [M] of an accept-length histogram [M + 1], and the histogram."""
    counts = hist.round().long().numpy()
    p = AcceptanceProfile.from_accept_lengths(np.repeat(np.arange(M + 1), counts), M)
    return p.reached, p.accepted, counts


def acceptance_histogram(
    beta: Tensor, batch: IDLMBatch, rows: Sequence[tuple[int, Any]], cfg: ProposalTrainConfig
) -> Tensor:
    """Accept-length histogram [M + 1] (float64) of the batch's own proposals under the ISD
    rule, from each MASK slot's acceptance probability ``beta [B, L]``; each example's draws
    are keyed by its id, so it does not depend on the batch."""
    ids = torch.tensor([i for i, _ in rows])
    acc = acceptance_from_beta(beta, slot_table(batch), ids, cfg.seed)
    return torch.bincount(acc.accept_len.cpu(), minlength=cfg.M + 1).double()


def upcoming_profile(tracker: ProfileTracker, summed: Tensor, M: int) -> dict[str, Any]:
    """The profile (``tracker`` with ``summed``'s histogram folded in) and α of a probe's
    ``summed`` histogram and loss totals ``[M + 1 + 4]``."""
    reached, accepted, _ = profile_counts(summed[: M + 1], M)
    tracker.update(AcceptanceProfile(reached, accepted))
    ce_noisy, ce_clean, n_noisy, n_clean = summed[M + 1 :].tolist()
    alpha = auto_alpha(ce_noisy / max(n_noisy, 1.0), ce_clean / max(n_clean, 1.0))
    return {"rates": tracker.posterior_mean().tolist(), "alpha": alpha}


def token_weights(
    cfg: ProposalTrainConfig, batch: IDLMBatch, ce_noisy: Tensor, rates: np.ndarray
) -> Tensor:
    """Per-token loss weights ``[B, L]`` (constants): one row ``[1, M]`` shared by every block,
    or D-PACE's per block from this batch's own target probabilities exp(−ℓ) (``ce_noisy
    [B, L]``, the MASK slots' CE); 0 off the MASK slots."""
    table = slot_table(batch)
    target_probs = None
    if cfg.weights == "dpace":
        tok_p = (-ce_noisy.float()).exp()  # [B, L]
        idx = table.index.clamp(min=0)
        gathered = tok_p.gather(1, idx.flatten(1)).view_as(idx)
        target_probs = torch.where(table.index >= 0, gathered, 1.0)
    w = position_weights(
        cfg.weights, cfg.M, rates=rates, target_probs=target_probs, gamma=cfg.gamma
    )
    device = batch.noisy_labels.device
    block_w = w.to(device).expand(*table.index.shape)  # [B, K, M]
    token_w = torch.zeros(batch.noisy_labels.shape, device=device)
    valid = table.index >= 0
    values = torch.where(valid, block_w, 0.0).flatten(1)
    token_w.scatter_(1, table.index.clamp(min=0).flatten(1), values)
    return torch.where(batch.noisy_labels != IGNORE, token_w, 0.0)


def slot_weight_sums(batch: IDLMBatch, token_w: Tensor) -> Tensor:
    """``[2, M]`` (float64): labelled MASK slots per proposal position, and their weights' sum."""
    M = batch.M
    lab = batch.noisy_labels != IGNORE
    slot = batch.slot.expand_as(token_w)[lab].cpu()
    out = torch.zeros(2, M, dtype=torch.float64)
    out[0].index_add_(0, slot, torch.ones(slot.numel(), dtype=torch.float64))
    out[1].index_add_(0, slot, token_w[lab].double().cpu())
    return out
