"""Prefix-conditioned candidate selection over one proposal block.

Paper: sec:inference_head, app:head_implementation.

Pure-torch float32 reference, written like the equations. A fused Triton kernel shares this
signature. Everything the recurrence needs that does not depend on earlier selections is
projected in parallel by the caller (:class:`brisk.runtime.corrector.Corrector`) into one
:class:`StepInputs`; this loop is the sequential part. For proposal position j = 1..M with
candidates C_j = TopK(q_j) (ranked by base logit, descending):

    φ_j   = [ℓ_j(c_1) − ℓ_j(c_2),  ℓ_j(c_1) − ℓ_j(c_4),  1[x_{j−1} = c_1],
             1[x_{j−1} ∈ c_{1..4}],  ℓ_j(c_1) − ℓ_j(x_{j−1})]                (5 features)
    in_j  = [P_m m_j ‖ P_e E(x_{j−1}) ‖ pos_j ‖ P_φ φ_j]                      (64+64+16+16)
    s_j   = (1 − z_j) ⊙ s_{j−1} + z_j ⊙ W_h in_j,   z_j = σ(W_z in_j)     (eq:inference_head_state;
                                                                          bias-free minimal GRU)
    d_jk  = ⟨W_s s_j, W_c E_out(c_k)⟩                                       (rank-64 residual)
    γ_j   = σ(α) σ(w_gᵀ [s_j; φ_j] + b_g)
    ℓ̃_jk  = ℓ_j(c_k) + γ_j d_jk              (eq:candidate_residual, eq:head_residual_logits)

x_j is the argmax of ℓ̃_j (greedy) or a draw from π_j = softmax(ℓ̃_j / T) over C_j by inverse
CDF with the given uniforms, and feeds position j + 1. x_0 is the anchor token. When x_{j−1} is
not among C_j its logit is taken as the K-th candidate's, so the last feature saturates at the
top-1 − top-K gap (only candidate logits are needed, which is what a fused kernel reads).

Without prefix feedback (``feedback=False``, an ablation) the head is never told x_{j−1}: its
embedding input is zero and x_{j−1} counts as outside C_j in φ_j, so every decision depends on
the parallel inputs alone (a position-wise reranker).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from brisk.runtime.sampling import sample_inverse_cdf

__all__ = [
    "N_FEATURES",
    "SelectOutput",
    "StepInputs",
    "StepWeights",
    "confidence_features",
    "corrector_select",
]

N_FEATURES = 5


@dataclass(frozen=True)
class StepWeights:
    """The corrector's own small matrices, as used inside the sequential loop."""

    pos_emb: Tensor  # [M, D_pos]
    feat_w: Tensor  # [D_feat, 5]
    feat_b: Tensor  # [D_feat]
    w_z: Tensor  # [S, D_in]   update gate of the minimal GRU
    w_h: Tensor  # [S, D_in]   candidate state of the minimal GRU
    w_s: Tensor  # [R, S]      state side of the residual
    gate_w: Tensor  # [S + 5]
    gate_b: Tensor  # []
    alpha: Tensor  # []


@dataclass(frozen=True)
class StepInputs:
    """One block's inputs to the sequential loop, as every implementation takes them: the
    projections that do not depend on earlier selections (computed in parallel by the caller),
    the candidates, the uniforms of the draw and, for teacher forcing, a recorded trajectory."""

    s0: Tensor  # [B, S]             initial state tanh(Init_ψ(h_c, E(x_0)))
    mask_x: Tensor  # [B, M, Dh]     P_m m_j
    anchor_e: Tensor  # [B, De]      P_e E(x_0)
    cand_e: Tensor  # [B, M, K, De]  P_e E(c_jk)
    cand_c: Tensor  # [B, M, K, R]   W_c E_out(c_jk)
    cand_logits: Tensor  # [B, M, K] base logits ℓ_j(c_k), descending in k
    cand_ids: Tensor  # [B, M, K]    C_j
    anchor_ids: Tensor  # [B]        x_0
    u: Tensor | None = None  # [B, M] uniforms that drive the draw at T > 0 (required there)
    # teacher forcing: (ids [B, M], P_e E(ids) [B, M, De]) fed back as x_{j−1} at every position
    forced_prev: tuple[Tensor, Tensor] | None = None

    @property
    def requires_grad(self) -> bool:
        """Whether gradients flow back through a projected input (the fused kernel has none)."""
        projected = (self.s0, self.mask_x, self.anchor_e, self.cand_e, self.cand_c)
        return any(t.requires_grad for t in (*projected, self.cand_logits))


@dataclass(frozen=True)
class SelectOutput:
    ranks: Tensor  # [B, M] int64, index of x_j in C_j
    probs: Tensor  # [B, M, K] softmax(ℓ̃ / T) over C_j (the proposal law π_j when sampling)
    refined: Tensor  # [B, M, K] refined logits ℓ̃


def confidence_features(cand_logits: Tensor, cand_ids: Tensor, prev_ids: Tensor) -> Tensor:
    """φ_j for one position: cand_logits, cand_ids ``[B, K]``, prev_ids ``[B]`` → ``[B, 5]``."""
    top1 = cand_logits[:, 0]
    top2 = cand_logits[:, min(1, cand_logits.shape[1] - 1)]
    top4 = cand_logits[:, min(3, cand_logits.shape[1] - 1)]
    hit = cand_ids == prev_ids[:, None]  # [B, K]
    prev_logit = torch.where(hit, cand_logits, cand_logits[:, -1:]).max(dim=1).values
    return torch.stack(
        [
            top1 - top2,
            top1 - top4,
            hit[:, 0].to(cand_logits.dtype),
            hit[:, :4].any(dim=1).to(cand_logits.dtype),
            top1 - prev_logit,
        ],
        dim=1,
    )


def corrector_select(
    inputs: StepInputs, weights: StepWeights, temperature: float, feedback: bool = True
) -> SelectOutput:
    """Select one token per position, left to right, feeding each choice into the next step.

    ``inputs`` as :class:`StepInputs` lists them (cand_logits descending). ``temperature`` 0
    selects the argmax; otherwise the uniforms ``inputs.u`` drive the draw.
    ``inputs.forced_prev`` replaces the fed-back previous token x_{j−1} at every position
    (teacher forcing on a recorded trajectory). ``feedback`` False hides x_{j−1} from the head
    (module docstring).
    """
    mask_x, cand_e, cand_c, u = inputs.mask_x, inputs.cand_e, inputs.cand_c, inputs.u
    cand_logits, cand_ids, forced_prev = inputs.cand_logits, inputs.cand_ids, inputs.forced_prev
    B, M, _K = cand_logits.shape
    batch = torch.arange(B, device=cand_logits.device)
    s = inputs.s0
    prev_ids, prev_e = inputs.anchor_ids, inputs.anchor_e
    ranks, probs, refined = [], [], []
    for j in range(M):
        if forced_prev is not None and j > 0:
            prev_ids, prev_e = forced_prev[0][:, j - 1], forced_prev[1][:, j - 1]
        if not feedback:
            prev_ids, prev_e = torch.full_like(prev_ids, -1), torch.zeros_like(prev_e)
        phi = confidence_features(cand_logits[:, j], cand_ids[:, j], prev_ids)  # [B, 5]
        in_j = torch.cat(
            [
                mask_x[:, j],
                prev_e,
                weights.pos_emb[j].expand(B, -1),
                phi @ weights.feat_w.T + weights.feat_b,
            ],
            dim=1,
        )  # [B, D_in]
        z = torch.sigmoid(in_j @ weights.w_z.T)  # [B, S]
        s = (1 - z) * s + z * (in_j @ weights.w_h.T)  # [B, S]
        d = torch.einsum("bkr,br->bk", cand_c[:, j], s @ weights.w_s.T)  # [B, K]
        gate = torch.sigmoid(weights.alpha) * torch.sigmoid(
            torch.cat([s, phi], dim=1) @ weights.gate_w + weights.gate_b
        )  # [B]
        logits = cand_logits[:, j] + gate[:, None] * d  # [B, K]
        if temperature > 0:
            assert u is not None
            p = torch.softmax(logits / temperature, dim=1)
            rank = sample_inverse_cdf(p, u[:, j])  # zero-probability candidates are never drawn
        else:
            p = torch.softmax(logits, dim=1)
            rank = logits.argmax(dim=1)
        ranks.append(rank)
        probs.append(p)
        refined.append(logits)
        prev_ids = cand_ids[batch, j, rank]
        prev_e = cand_e[batch, j, rank]
    return SelectOutput(torch.stack(ranks, 1), torch.stack(probs, 1), torch.stack(refined, 1))
