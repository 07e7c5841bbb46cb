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
from typing import Any, Literal

import torch
from torch import Tensor

from brisk.runtime.drafter.model import DFlashDrafter
from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
    decay_weights,
    dpace_weights,
    progress_weights,
    uniform_weights,
)

__all__ = [
    "WEIGHTINGS",
    "Blocks",
    "DrafterLoss",
    "block_attention",
    "drafter_loss",
    "make_blocks",
    "sample_anchors",
    "weights_for",
]

Weighting = Literal["brisk", "dpace", "decay", "uniform"]
WEIGHTINGS: tuple[Weighting, ...] = ("brisk", "dpace", "decay", "uniform")


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
    probability of each target token ``token_probs [..., M]``)."""
    if weighting == "uniform":
        return torch.as_tensor(uniform_weights(M))
    if weighting == "decay":
        return torch.as_tensor(decay_weights(M, gamma))
    if weighting == "dpace":
        if token_probs is None:
            raise ValueError("dpace: needs the drafter's probability of each target token")
        return dpace_weights(token_probs.detach().double().clamp(0, 1), alpha)
    if weighting == "brisk":
        if tracker is None:
            raise ValueError("brisk: needs the acceptance profile tracker")
        a = torch.as_tensor(tracker.posterior_mean())
        return progress_weights(a, CostModel.speculative(M))
    raise ValueError(f"weighting: one of {', '.join(WEIGHTINGS)}, got {weighting!r}")


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
    """The drafter's loss on a batch (module docstring): Σ w_k · CE / (trained targets), the
    target frozen (its forward, embeddings and LM head run without gradient)."""
    spec = drafter.spec
    M = spec.M
    B, S = ids.shape
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
        features = drafter.features(out.hidden_states)
    a, keep = sample_anchors(supervised, anchors, generator)
    blocks = make_blocks(ids, supervised, a, keep, M, spec.mask_token_id)
    positions = torch.arange(S, device=ids.device).expand(B, S)
    context = drafter.context_kv(drafter.project(features), positions)
    with torch.no_grad():
        embeds = target.get_input_embeddings()(blocks.ids)
    mask = block_attention(a, keep, S, M + 1)
    hidden = drafter(embeds, blocks.positions, context, mask)
    n = a.shape[1]
    hidden = hidden.view(B, n, M + 1, -1)[:, :, 1:]
    logits = target.get_output_embeddings()(hidden).float()  # [B, n, M, V]
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), blocks.labels.reshape(-1), reduction="none"
    ).view(B, n, M)
    valid = blocks.valid
    with torch.no_grad():
        match = (logits.argmax(-1) == blocks.labels) & valid
        # leading matches of each kept block whose first target is trained
        lengths = match.long().cumprod(-1).sum(-1)[keep & valid[..., 0]]
        profile = AcceptanceProfile.from_accept_lengths(lengths.cpu().numpy(), M)
    if tracker is not None:
        tracker.update(profile)
    # D-PACE's q = exp(−CE), 1 where nothing is trained (a no-op in its prefix products)
    q = torch.where(valid, torch.exp(-ce.detach()), 1.0)
    w = weights_for(weighting, M, tracker=tracker, token_probs=q, alpha=alpha, gamma=gamma).to(ce)
    vf = valid.to(ce.dtype)
    count = vf.sum().clamp(min=1)
    loss = (w * ce * vf).sum() / count
    with torch.no_grad():
        per_position = (ce * vf).sum((0, 1)) / vf.sum((0, 1)).clamp(min=1)
        shown = w.reshape(-1, M).mean(0) if w.ndim > 1 else w
    return DrafterLoss(loss, per_position.detach(), profile, shown.detach(), int(valid.sum()))
