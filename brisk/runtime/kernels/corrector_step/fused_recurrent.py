"""The corrector's sequential part as one Triton launch per verify round (the naive twin's math).

Same signature (a :class:`~brisk.runtime.kernels.corrector_step.naive.StepInputs`, the weights,
the temperature) and outputs as :func:`brisk.runtime.kernels.corrector_step.naive.corrector_select`
(ranks, probs, refined): one program per request of the batch runs all M positions in order,
and for each position the 5 confidence features φ_j, the input projections of the minimal GRU
(its weight matrices split by column into the MASK-state, previous-token, position and feature
blocks of in_j = [P_m m_j ‖ P_e E(x_{j−1}) ‖ pos_j ‖ P_φ φ_j]), the state update, the rank-R
residual d_jk = ⟨W_s s_j, W_c E_out(c_jk)⟩ over all K candidates, the gate, the refined logits,
greedy (first maximum) or inverse-CDF selection with the given uniform, and the fed-back
previous token and its 64-wide projected embedding row. Everything is computed in float32
whatever the input dtype (float32, bfloat16, float16). There is no backward: training goes
through the naive twin.

The module reads ``TRITON_INTERPRET`` when it is first imported (Triton decides then whether
the kernel runs compiled on a GPU or interpreted on CPU tensors).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from brisk.runtime.kernels.corrector_step.naive import (
    N_FEATURES,
    SelectOutput,
    StepInputs,
    StepWeights,
)

__all__ = ["INTERPRET", "MAX_BLOCK", "corrector_select_fused", "unsupported"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
MAX_BLOCK = 256  # widest padded dimension (K, S, R, projections) one program holds in registers
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _matvec(w_ptr, row_stride, col0, rows, cols, n_rows, n_cols, x):
    """Σ_c W[r, col0 + c] · x[c] for the padded block rows × cols of a row-major matrix."""
    m = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    w = tl.load(w_ptr + rows[:, None] * row_stride + col0 + cols[None, :], mask=m, other=0.0)
    return tl.sum(w * x[None, :], axis=1)


@triton.jit
def _pick(values, index, at):
    """values[at] of a padded vector (0 where ``index`` never equals ``at``)."""
    return tl.sum(tl.where(index == at, values, 0.0), axis=0)


@triton.jit
def _corrector_select_kernel(
    s0_ptr,
    mask_x_ptr,
    anchor_e_ptr,
    cand_e_ptr,
    cand_c_ptr,
    cand_logits_ptr,
    cand_ids_ptr,
    anchor_ids_ptr,
    u_ptr,
    forced_ids_ptr,
    forced_e_ptr,
    pos_ptr,
    feat_w_ptr,
    feat_b_ptr,
    w_z_ptr,
    w_h_ptr,
    w_s_ptr,
    gate_w_ptr,
    gate_b_ptr,
    alpha_ptr,
    ranks_ptr,
    probs_ptr,
    refined_ptr,
    M,
    K,
    S,
    DH,
    DE,
    DP,
    DF,
    R,
    temperature,
    BK: tl.constexpr,
    BS: tl.constexpr,
    BDH: tl.constexpr,
    BDE: tl.constexpr,
    BDP: tl.constexpr,
    BDF: tl.constexpr,
    BR: tl.constexpr,
    NF: tl.constexpr,
    SAMPLE: tl.constexpr,
    FORCED: tl.constexpr,
    FEEDBACK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    DIN = DH + DE + DP + DF
    rk = tl.arange(0, BK)
    rs = tl.arange(0, BS)
    rh = tl.arange(0, BDH)
    re = tl.arange(0, BDE)
    rp = tl.arange(0, BDP)
    rf = tl.arange(0, BDF)
    rr = tl.arange(0, BR)
    r5 = tl.arange(0, 8)
    mk = rk < K
    ms = rs < S
    me = re < DE

    feat_b = tl.load(feat_b_ptr + rf, mask=rf < DF, other=0.0)
    gate_ws = tl.load(gate_w_ptr + rs, mask=ms, other=0.0)
    gate_wf = tl.load(gate_w_ptr + S + r5, mask=r5 < NF, other=0.0)
    gate_b = tl.load(gate_b_ptr)
    gate_a = tl.sigmoid(tl.load(alpha_ptr))

    s = tl.load(s0_ptr + b * S + rs, mask=ms, other=0.0).to(tl.float32)
    prev_id = tl.load(anchor_ids_ptr + b)
    prev_e = tl.load(anchor_e_ptr + b * DE + re, mask=me, other=0.0).to(tl.float32)
    for j in range(M):
        row = b * M + j
        if FORCED:  # teacher forcing: x_{j−1} is the recorded token, for j ≥ 1
            back = row - 1 + (j == 0)
            f_id = tl.load(forced_ids_ptr + back)
            f_e = tl.load(forced_e_ptr + back * DE + re, mask=me, other=0.0).to(tl.float32)
            prev_id = tl.where(j > 0, f_id, prev_id)
            prev_e = tl.where(j > 0, f_e, prev_e)
        if not FEEDBACK:  # the position-wise ablation: x_{j−1} is hidden
            prev_id = tl.full((), -1, tl.int64)
            prev_e = tl.zeros([BDE], dtype=tl.float32)

        # φ_j from the candidate logits (descending) and ids
        lg = tl.load(cand_logits_ptr + row * K + rk, mask=mk, other=0.0).to(tl.float32)
        ids = tl.load(cand_ids_ptr + row * K + rk, mask=mk, other=-1)
        top1 = _pick(lg, rk, 0)
        top2 = _pick(lg, rk, tl.minimum(1, K - 1))
        top4 = _pick(lg, rk, tl.minimum(3, K - 1))
        last = _pick(lg, rk, K - 1)
        hit = (ids == prev_id) & mk
        hit0 = tl.sum(tl.where(hit & (rk == 0), 1.0, 0.0), axis=0)
        in4 = tl.max(tl.where(hit & (rk < 4), 1.0, 0.0), axis=0)
        prev_logit = tl.max(tl.where(mk, tl.where(hit, lg, last), float("-inf")), axis=0)
        phi = tl.where(r5 == 0, top1 - top2, 0.0)
        phi = tl.where(r5 == 1, top1 - top4, phi)
        phi = tl.where(r5 == 2, hit0, phi)
        phi = tl.where(r5 == 3, in4, phi)
        phi = tl.where(r5 == 4, top1 - prev_logit, phi)

        # in_j and the minimal GRU: z = σ(W_z in), s = (1 − z) s + z (W_h in)
        feat = _matvec(feat_w_ptr, NF, 0, rf, r5, DF, NF, phi) + feat_b
        mx = tl.load(mask_x_ptr + row * DH + rh, mask=rh < DH, other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + j * DP + rp, mask=rp < DP, other=0.0).to(tl.float32)
        z = _matvec(w_z_ptr, DIN, 0, rs, rh, S, DH, mx)
        z += _matvec(w_z_ptr, DIN, DH, rs, re, S, DE, prev_e)
        z += _matvec(w_z_ptr, DIN, DH + DE, rs, rp, S, DP, pos)
        z += _matvec(w_z_ptr, DIN, DH + DE + DP, rs, rf, S, DF, feat)
        h = _matvec(w_h_ptr, DIN, 0, rs, rh, S, DH, mx)
        h += _matvec(w_h_ptr, DIN, DH, rs, re, S, DE, prev_e)
        h += _matvec(w_h_ptr, DIN, DH + DE, rs, rp, S, DP, pos)
        h += _matvec(w_h_ptr, DIN, DH + DE + DP, rs, rf, S, DF, feat)
        z = tl.sigmoid(z)
        s = (1.0 - z) * s + z * h

        # the candidate residual, the gate and the refined logits
        v = _matvec(w_s_ptr, S, 0, rr, rs, R, S, s)  # W_s s, [R]
        cm = mk[:, None] & (rr[None, :] < R)
        cc = tl.load(cand_c_ptr + (row * K + rk[:, None]) * R + rr[None, :], mask=cm, other=0.0)
        d = tl.sum(cc.to(tl.float32) * v[None, :], axis=1)
        gate = gate_a * tl.sigmoid(
            tl.sum(gate_ws * s, axis=0) + tl.sum(gate_wf * phi, axis=0) + gate_b
        )
        refined = lg + gate * d

        # the proposal law over C_j and the selection
        x = tl.where(mk, refined / temperature, float("-inf"))
        e = tl.where(mk, tl.exp(x - tl.max(x, axis=0)), 0.0)
        p = e / tl.sum(e, axis=0)
        if SAMPLE:  # inverse CDF, as brisk.runtime.sampling.sample_inverse_cdf
            cdf = tl.cumsum(p, axis=0)
            target = tl.load(u_ptr + row).to(tl.float32) * _pick(cdf, rk, K - 1)
            idx = tl.sum(tl.where(mk & (cdf <= target), 1, 0), axis=0)
            last_pos = tl.max(tl.where(mk & (p > 0), rk, 0), axis=0)
            rank = tl.minimum(idx, last_pos)
        else:  # the first maximum
            rank = tl.argmax(x, axis=0, tie_break_left=True)
        tl.store(refined_ptr + row * K + rk, refined, mask=mk)
        tl.store(probs_ptr + row * K + rk, p, mask=mk)
        tl.store(ranks_ptr + row, rank.to(tl.int64))
        prev_id = tl.sum(tl.where(rk == rank, ids, 0), axis=0)
        prev_e = tl.load(cand_e_ptr + (row * K + rank) * DE + re, mask=me, other=0.0).to(tl.float32)


def _block(n: int) -> int:
    return max(triton.next_power_of_2(n), 2)


def unsupported(inputs: StepInputs, weights: StepWeights) -> str | None:
    """Why the kernel cannot take these inputs (None: it can)."""
    for name, t in (
        ("s0", inputs.s0),
        ("mask_x", inputs.mask_x),
        ("cand_e", inputs.cand_e),
        ("cand_c", inputs.cand_c),
        ("cand_logits", inputs.cand_logits),
    ):
        if t.dtype not in DTYPES:
            return f"{name} has dtype {t.dtype} (the kernel reads float32, bfloat16, float16)"
    widths = {
        "K": inputs.cand_logits.shape[-1],
        "state": inputs.s0.shape[-1],
        "rank": inputs.cand_c.shape[-1],
        "hidden projection": inputs.mask_x.shape[-1],
        "token projection": inputs.cand_e.shape[-1],
        "position": weights.pos_emb.shape[-1],
        "feature": weights.feat_w.shape[0],
    }
    for name, width in widths.items():
        if width > MAX_BLOCK:
            return f"{name} width {width} exceeds the kernel's {MAX_BLOCK}"
    if weights.feat_w.shape[1] != N_FEATURES:
        return f"feat_w has {weights.feat_w.shape[1]} features, the kernel computes {N_FEATURES}"
    return None


def corrector_select_fused(
    inputs: StepInputs, weights: StepWeights, temperature: float, feedback: bool = True
) -> SelectOutput:
    """The naive twin's selection in one launch (module docstring); same arguments."""
    B, M, K = inputs.cand_logits.shape
    device = inputs.cand_logits.device
    S, DH = inputs.s0.shape[-1], inputs.mask_x.shape[-1]
    DE, R = inputs.cand_e.shape[-1], inputs.cand_c.shape[-1]
    DP, DF = weights.pos_emb.shape[-1], weights.feat_w.shape[0]
    # NaN / −1 poisoned: an element the kernel fails to write cannot pass for a result
    ranks = torch.full((B, M), -1, dtype=torch.long, device=device)
    probs = torch.full((B, M, K), float("nan"), dtype=torch.float32, device=device)
    refined = torch.full((B, M, K), float("nan"), dtype=torch.float32, device=device)
    if B == 0 or M == 0:
        return SelectOutput(ranks, probs, refined)

    def c(t: Tensor) -> Tensor:
        return t.contiguous()

    def f(t: Tensor) -> Tensor:
        return t.detach().float().contiguous()

    def ids(t: Tensor) -> Tensor:  # one integer type for every token id the loop carries
        return t.long().contiguous()

    sample = temperature > 0
    u_arg = c(inputs.u) if inputs.u is not None else probs  # never read when greedy
    forced = inputs.forced_prev
    f_ids, f_e = (c(forced[0]), c(forced[1])) if forced is not None else (ranks, probs)
    _corrector_select_kernel[(B,)](
        c(inputs.s0),
        c(inputs.mask_x),
        c(inputs.anchor_e),
        c(inputs.cand_e),
        c(inputs.cand_c),
        c(inputs.cand_logits),
        ids(inputs.cand_ids),
        ids(inputs.anchor_ids),
        u_arg,
        f_ids,
        f_e,
        f(weights.pos_emb),
        f(weights.feat_w),
        f(weights.feat_b),
        f(weights.w_z),
        f(weights.w_h),
        f(weights.w_s),
        f(weights.gate_w),
        f(weights.gate_b),
        f(weights.alpha),
        ranks,
        probs,
        refined,
        M,
        K,
        S,
        DH,
        DE,
        DP,
        DF,
        R,
        temperature if sample else 1.0,
        BK=_block(K),
        BS=_block(S),
        BDH=_block(DH),
        BDE=_block(DE),
        BDP=_block(DP),
        BDF=_block(DF),
        BR=_block(R),
        NF=N_FEATURES,
        SAMPLE=sample,
        FORCED=forced is not None,
        FEEDBACK=feedback,
    )
    return SelectOutput(ranks, probs, refined)
