"""Training a block drafter on its target's hidden states (the drafter family, paper
sec:background and the cross-backbone experiment): the loss of one batch under the four
weightings the paper compares.

A batch is token ids ``[B, S]`` (the target's own regenerated responses after their prompts)
and a mask of the supervised tokens (the responses). Per sequence, up to ``anchors`` anchor
positions a are drawn among the supervised tokens whose next token is supervised too, and
each becomes a block ``[x_a, MASK × M]`` at positions a..a+M whose offset k = 1..M is trained
to predict the token at a + k, against the context of every position before a (strictly: the
anchor's own hidden state is not known at inference either). One target forward (no
gradient) gives the features of all S positions; one drafter forward runs every block of the
batch at once, each query seeing its own block (both directions) and the context before its
anchor (:func:`block_attention`), which is exactly what the inference loop
(:mod:`brisk.runtime.drafter.speculative`) shows the drafter.

Weights of position k (each normalized to mean one over the block, so every scheme trains on
the same loss scale and a token budget means the same thing):

- ``brisk``: renewal-reward weights (eq:brisk_weighting) under the speculative cost model
  g_k = k + 1, c_k = 1 at the dynamic profile: the drafter's teacher-forced acceptance on the
  recent batches (its argmax equal to the target's token, leading matches per block), tracked
  with :class:`~brisk.theory.ProfileTracker`;
- ``dpace``: D-PACE's, from the drafter's own probability of each target token (detached);
- ``decay``: DFlash's exp(−(k − 1)/γ), γ = 7;
- ``uniform``: 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from brisk.runtime.drafter.model import DFlashDrafter
from brisk.runtime.train.common import scheme_weights
from brisk.runtime.train.drafter.config import WEIGHTINGS, Weighting
from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
)

__all__ = [
    "WEIGHTINGS",
    "BlockLosses",
    "Blocks",
    "DrafterLoss",
    "DrafterStep",
    "accept_histogram",
    "block_attention",
    "block_losses",
    "drafter_loss",
    "histogram_profile",
    "make_blocks",
    "position_weights",
    "sample_anchors",
    "weights_for",
]


def sample_anchors(
    supervised: Tensor, anchors: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Up to ``anchors`` anchor positions per row of ``supervised [B, S]`` (bool), drawn
    uniformly without replacement among the positions a with a and a + 1 supervised, sorted.
    Returns ``(anchors [B, n], keep [B, n])``: rows with fewer candidates fill the rest with 0
    and ``keep`` False."""
    B, S = supervised.shape
    ok = torch.zeros_like(supervised)
    ok[:, :-1] = supervised[:, :-1] & supervised[:, 1:]
    if not bool(ok.any()):
        raise ValueError("supervised: no sequence has two consecutive supervised tokens")
    noise = torch.rand(B, S, generator=generator).to(supervised.device)  # the CPU's stream
    order = torch.where(ok, noise, 2.0).argsort(dim=1)  # candidates first, in random order
    n = min(anchors, int(ok.sum(1).max()))
    chosen = order[:, :n]
    keep = ok.gather(1, chosen)
    chosen = torch.where(keep, chosen, S)  # the fill sorts last
    chosen, perm = chosen.sort(dim=1)
    keep = keep.gather(1, perm)
    return torch.where(keep, chosen, 0), keep


@dataclass(frozen=True)
class Blocks:
    """Every block of a batch: ids and positions ``[B, n·(M+1)]``, the targets ``[B, n, M]``
    (offset k predicts the token at a + k) and which of them are trained."""

    ids: Tensor
    positions: Tensor
    labels: Tensor
    valid: Tensor
    anchors: Tensor  # [B, n]
    keep: Tensor  # [B, n]


def make_blocks(
    ids: Tensor, supervised: Tensor, anchors: Tensor, keep: Tensor, M: int, mask_token_id: int
) -> Blocks:
    """The blocks ``[x_a, MASK × M]`` at the anchors, and their labels."""
    B, S = ids.shape
    n = anchors.shape[1]
    offsets = torch.arange(M + 1, device=ids.device)
    at = anchors[..., None] + offsets  # [B, n, M+1] positions
    block = torch.full((B, n, M + 1), mask_token_id, dtype=ids.dtype, device=ids.device)
    block[..., 0] = ids.gather(1, anchors)
    inside = at[..., 1:] < S
    where = at[..., 1:].clamp(max=S - 1).reshape(B, -1)
    labels = ids.gather(1, where).view(B, n, M)
    valid = keep[..., None] & inside & supervised.gather(1, where).view(B, n, M)
    return Blocks(block.view(B, -1), at.view(B, -1), labels, valid, anchors, keep)


def block_attention(anchors: Tensor, keep: Tensor, S: int, block: int) -> Tensor:
    """Which keys each block query sees, ``[B, 1, n·block, S + n·block]`` bool: the context
    positions before its anchor and its own block. A dropped block (``keep`` False) sees its
    own block only (its loss is masked; a query must see some key)."""
    B, n = anchors.shape
    device = anchors.device
    ctx = torch.arange(S, device=device)[None, None] < anchors[..., None]  # [B, n, S]
    ctx = ctx & keep[..., None]
    own = torch.eye(n, dtype=torch.bool, device=device)  # block b sees block b
    own = own[:, None, :, None].expand(n, block, n, block).reshape(n * block, n * block)
    ctx_q = ctx[:, :, None, :].expand(B, n, block, S).reshape(B, n * block, S)
    return torch.cat([ctx_q, own[None].expand(B, -1, -1)], dim=-1)[:, None]


def weights_for(
    weighting: Weighting,
    M: int,
    *,
    tracker: ProfileTracker | None = None,
    token_probs: Tensor | None = None,
    alpha: float = 0.5,
    gamma: float = 7.0,
) -> Tensor:
    """Per-position weights, mean one: ``[M]`` (``[..., M]`` for D-PACE, from the drafter's
    probability of each target token ``token_probs [..., M]``; BRISK's from the posterior mean
    of ``tracker``'s profile under the speculative cost model): :func:`scheme_weights`."""
    brisk = weighting == "brisk" and tracker is not None
    return scheme_weights(
        weighting,
        M,
        CostModel.speculative(M),
        rates=torch.as_tensor(tracker.posterior_mean()) if brisk else None,
        token_probs=token_probs,
        alpha=alpha,
        gamma=gamma,
    )


class DrafterStep(nn.Module):
    """The drafter's share of a training forward as one module call, the unit DDP replicates
    and FSDP2 shards: the target's features projected into every layer's context keys and
    values (:meth:`~DFlashDrafter.project`, :meth:`~DFlashDrafter.context_kv`), then the blocks
    run against them. A wrapper's hooks fire on ``forward`` alone, so the drafter's other
    methods are called inside it. ``checkpointing``: the backward recomputes this forward
    (non-reentrant activation checkpointing) instead of keeping its activations."""

    def __init__(self, drafter: DFlashDrafter, checkpointing: bool = False) -> None:
        super().__init__()
        self.drafter = drafter
        self.checkpointing = checkpointing

    def forward(
        self, features: Tensor, positions: Tensor, embeds: Tensor, at: Tensor, mask: Tensor
    ) -> Tensor:
        """Normed hidden states ``[B, n·(M+1), H]`` of the block embeddings ``embeds`` at
        positions ``at`` against the context ``features [B, S, k·H]`` at ``positions``."""
        if self.checkpointing and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            out: Tensor = checkpoint(
                self._blocks, features, positions, embeds, at, mask, use_reentrant=False
            )
            return out
        return self._blocks(features, positions, embeds, at, mask)

    def _blocks(
        self, features: Tensor, positions: Tensor, embeds: Tensor, at: Tensor, mask: Tensor
    ) -> Tensor:
        drafter = self.drafter
        context = drafter.context_kv(drafter.project(features), positions)
        hidden: Tensor = drafter(embeds, at, context, mask)
        return hidden


@dataclass(frozen=True)
class BlockLosses:
    """One forward of a batch's blocks: the plain CE of every target (with its graph), which
    targets are trained, and the teacher-forced accept length of each kept block whose first
    target is trained (its leading argmax matches; CPU)."""

    ce: Tensor  # [B, n, M]
    valid: Tensor  # [B, n, M]
    lengths: Tensor  # [blocks] int64


def block_losses(
    target: Any,
    drafter: DFlashDrafter,
    net: Any,
    ids: Tensor,
    blocks: Blocks,
    features: Tensor | None = None,
) -> BlockLosses:
    """The blocks of ``ids [B, S]`` (:func:`make_blocks`) through the frozen target (its
    forward, embeddings and LM head without gradient to their weights) and ``net``, the
    :class:`DrafterStep` of ``drafter`` or its DDP / FSDP wrapper. ``features``: the target's
    features of ``ids`` already computed (:mod:`~brisk.runtime.train.drafter.features`), which
    spares the target's forward."""
    M = drafter.spec.M
    B, S = ids.shape
    with torch.no_grad():
        if features is None:
            out = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
            features = drafter.features(out.hidden_states)
        embeds = target.get_input_embeddings()(blocks.ids)
    positions = torch.arange(S, device=ids.device).expand(B, S)
    mask = block_attention(blocks.anchors, blocks.keep, S, M + 1)
    hidden = net(features, positions, embeds, blocks.positions, mask)
    n = blocks.anchors.shape[1]
    hidden = hidden.view(B, n, M + 1, -1)[:, :, 1:]
    head = target.get_output_embeddings()
    logits = head(hidden.to(head.weight.dtype)).float()  # [B, n, M, V]
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), blocks.labels.reshape(-1), reduction="none"
    ).view(B, n, M)
    valid = blocks.valid
    with torch.no_grad():
        match = (logits.argmax(-1) == blocks.labels) & valid
        lengths = match.long().cumprod(-1).sum(-1)[blocks.keep & valid[..., 0]].cpu()
    return BlockLosses(ce, valid, lengths)


def accept_histogram(lengths: Tensor, M: int) -> Tensor:
    """``[M + 1]`` float64: how many blocks have each accept length 0..M (summable over ranks
    and micro-batches; :func:`histogram_profile` reads it)."""
    return torch.bincount(lengths.cpu(), minlength=M + 1).double()


def histogram_profile(histogram: Tensor, M: int) -> AcceptanceProfile:
    """The acceptance profile of the blocks :func:`accept_histogram` counted."""
    counts = histogram.round().long().numpy()
    return AcceptanceProfile.from_accept_lengths(np.repeat(np.arange(M + 1), counts), M)


def position_weights(
    weighting: Weighting,
    losses: BlockLosses,
    *,
    tracker: ProfileTracker | None = None,
    alpha: float = 0.5,
    gamma: float = 7.0,
) -> Tensor:
    """The weights of ``losses``' targets (:func:`weights_for`, constants in backprop): ``[M]``,
    or ``[B, n, M]`` for D-PACE, from each target's probability exp(−CE) (1 where nothing is
    trained: a no-op in its prefix products)."""
    q = torch.where(losses.valid, torch.exp(-losses.ce.detach()), 1.0)
    M = losses.ce.shape[-1]
    w = weights_for(weighting, M, tracker=tracker, token_probs=q, alpha=alpha, gamma=gamma)
    return w.to(losses.ce)


@dataclass(frozen=True)
class DrafterLoss:
    """One batch's loss and what the loop logs: the weighted CE, the plain CE per position,
    the batch's teacher-forced acceptance profile and the weights used."""

    loss: Tensor
    ce: Tensor  # [M] mean plain CE per position over the trained targets
    profile: AcceptanceProfile
    weights: Tensor  # [M] (D-PACE: their mean over the blocks)
    tokens: int  # trained targets


def drafter_loss(
    target: Any,
    drafter: DFlashDrafter,
    ids: Tensor,
    supervised: Tensor,
    weighting: Weighting,
    *,
    anchors: int = 64,
    tracker: ProfileTracker | None = None,
    generator: torch.Generator | None = None,
    alpha: float = 0.5,
    gamma: float = 7.0,
) -> DrafterLoss:
    """The drafter's loss on a batch in one process (module docstring): Σ w_k · CE / (trained
    targets), the target frozen. The tracker takes the batch's profile before the weights are
    computed. ``brisk train drafter`` runs the same pieces (:func:`sample_anchors`,
    :func:`make_blocks`, :func:`block_losses`, :func:`position_weights`) over ranks and
    micro-batches (:mod:`brisk.runtime.train.drafter.recipe`)."""
    M = drafter.spec.M
    a, keep = sample_anchors(supervised, anchors, generator)
    blocks = make_blocks(ids, supervised, a, keep, M, drafter.spec.mask_token_id)
    losses = block_losses(target, drafter, DrafterStep(drafter), ids, blocks)
    profile = AcceptanceProfile.from_accept_lengths(losses.lengths.numpy(), M)
    if tracker is not None:
        tracker.update(profile)
    w = position_weights(weighting, losses, tracker=tracker, alpha=alpha, gamma=gamma)
    ce, valid = losses.ce, losses.valid
    vf = valid.to(ce.dtype)
    count = vf.sum().clamp(min=1)
    loss = (w * ce * vf).sum() / count
    with torch.no_grad():
        per_position = (ce * vf).sum((0, 1)) / vf.sum((0, 1)).clamp(min=1)
        shown = w.reshape(-1, M).mean(0) if w.ndim > 1 else w
    return DrafterLoss(loss, per_position.detach(), profile, shown.detach(), int(valid.sum()))
