"""The training losses from last hidden states, in chunks over the vocabulary's rows: no
``[B, 2L, V]`` logits tensor, no ``[n, M, V]`` float64 one.

At I-DLM-8B shapes a micro-batch of 4 × 4,096 tokens per stream has ``[4, 8192, 151936]`` bf16
logits (10 GB), and the CE's float32 copy and its gradient double and triple that. Here the LM
head is applied to a chunk of labelled positions at a time, and each chunk gives, per position
j, everything a training step reads:

- ``ℓ_j^noisy = logsumexp z_q − z_q[x_{j+1}]`` at MASK slots with a label (the proposal CE);
- ``ℓ_j^clean`` likewise from the clean stream (the verifier, a causal LM);
- the acceptance probability of the slot's proposal given the prefix (ISD at temperature T,
  drafts from q restricted to its Top-K, :mod:`brisk.runtime.train.proposal.acceptance`)

      β_j = Σ_{v ∈ C_K} min(p_j(v), q_j^K(v)),  q_j^K = softmax(z_q[C_K] / T),
      p_j = softmax(z_p / T),                    (greedy: β_j = 1[argmax z_q = argmax z_p])

  from p's logsumexp and a K-wide gather of the clean logits at q's Top-K, in float32.

The backward recomputes each chunk's logits (:class:`_ChunkedStreams`, the chunked
cross-entropy of Liger-Kernel's fused linear CE, written with torch ops): the memory of the
head is one chunk of ``[c, V]`` float32 logits, whatever the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.train.idlm import IGNORE, IDLMBatch

__all__ = ["CHUNK_ELEMENTS", "StreamLosses", "acceptance_probability", "stream_losses"]

CHUNK_ELEMENTS = 1 << 25
"""Logits computed at once: 32 M float32 (128 MB), ≈ 220 positions at V = 151,936."""


def acceptance_probability(
    q_logits: Tensor, p_logits: Tensor, temperature: float, top_k: int
) -> Tensor:
    """β of each row ``[..., V]`` of proposal logits ``q_logits`` and verifier logits
    ``p_logits`` (module docstring), in float32 at least, with no ``[..., V]`` tensor beyond
    the two softmax normalizers."""
    if temperature == 0:
        return (q_logits.argmax(-1) == p_logits.argmax(-1)).to(_accumulate(q_logits.dtype))
    k, acc = min(top_k, q_logits.shape[-1]), _accumulate(q_logits.dtype)
    top, ids = q_logits.to(acc).topk(k, dim=-1)  # [..., K] C_K by base logit
    q_k = torch.softmax(top / temperature, dim=-1)
    p_scaled = p_logits.to(acc) / temperature
    p_k = (p_scaled.gather(-1, ids) - p_scaled.logsumexp(-1, keepdim=True)).exp()
    return torch.minimum(p_k, q_k).sum(-1).clamp(0, 1)


@dataclass(frozen=True)
class StreamLosses:
    """Per-position figures of one micro-batch, each ``[B, L]`` float32 (float64 for float64
    hidden states)."""

    noisy: Tensor  # ℓ^noisy with its graph, 0 where the MASK slot has no label
    clean: Tensor  # ℓ^clean with its graph, 0 where no response token is predicted
    beta: Tensor  # acceptance probability of the slot's proposal, no graph, 0 where unlabelled

    def totals(self, batch: IDLMBatch) -> Tensor:
        """``[Σ ℓ_noisy, Σ ℓ_clean, n_noisy, n_clean]`` float64 on the CPU, no graph: what the
        loss's denominators and α are summed from (over micro-batches and ranks)."""
        n_noisy = (batch.noisy_labels != IGNORE).sum()
        n_clean = (batch.clean_labels != IGNORE).sum()
        parts = [self.noisy.detach().sum(), self.clean.detach().sum(), n_noisy, n_clean]
        return torch.stack([x.double() for x in parts]).cpu()


def stream_losses(
    hidden_noisy: Tensor,
    hidden_clean: Tensor,
    weight: Tensor,
    batch: IDLMBatch,
    *,
    temperature: float = 1.0,
    top_k: int = 16,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> StreamLosses:
    """ℓ^noisy, ℓ^clean and β (module docstring) of every labelled position of ``batch`` from
    the last hidden states ``[B, L, H]`` of both streams and the LM head's ``weight [V, H]``;
    gradients reach the hidden states and the weight."""
    clean_ok = batch.clean_labels != IGNORE  # ⊇ the MASK slots with a label
    rows, cols = clean_ok.nonzero(as_tuple=True)
    noisy_labels = batch.noisy_labels[rows, cols]
    clean_labels = batch.clean_labels[rows, cols]
    chunk = max(1, chunk_elements // weight.shape[0])
    ce_noisy, ce_clean, beta = _ChunkedStreams.apply(
        hidden_noisy[rows, cols],
        hidden_clean[rows, cols],
        weight,
        noisy_labels,
        clean_labels,
        chunk,
        float(temperature),
        int(top_k),
    )
    shape = batch.noisy_labels.shape
    device = hidden_noisy.device

    def place(values: Tensor) -> Tensor:
        out = torch.zeros(shape, dtype=values.dtype, device=device)
        return out.index_put((rows, cols), values)

    return StreamLosses(place(ce_noisy), place(ce_clean), place(beta))


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """``hidden [c, H] @ weight.T`` in the compute dtype (autocast's, or the parameters'), as
    float32 (float64 stays float64)."""
    z = hidden @ weight.to(hidden.dtype).T
    return z.to(_accumulate(z.dtype))


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _ce(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row CE and logsumexp; rows labelled IGNORE give 0."""
    lse = logits.logsumexp(-1)
    target = logits.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    return torch.where(labels != IGNORE, lse - target, 0.0), lse


class _ChunkedStreams(torch.autograd.Function):
    """Both streams' per-position CE and β over chunks of positions; the backward recomputes
    each chunk's logits and returns the hidden states' and the weight's gradients."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        h_noisy: Tensor,
        h_clean: Tensor,
        weight: Tensor,
        noisy_labels: Tensor,
        clean_labels: Tensor,
        chunk: int,
        temperature: float,
        top_k: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, acc = h_noisy.shape[0], _accumulate(h_noisy.dtype)
        ce_noisy, ce_clean, beta = (h_noisy.new_zeros(n, dtype=acc) for _ in range(3))
        lse = h_noisy.new_zeros(2, n, dtype=acc)
        with torch.no_grad():
            for s in range(0, n, chunk):
                z_q, z_p = (
                    _logits(h_noisy[s : s + chunk], weight),
                    _logits(h_clean[s : s + chunk], weight),
                )
                ce_noisy[s : s + chunk], lse[0, s : s + chunk] = _ce(
                    z_q, noisy_labels[s : s + chunk]
                )
                ce_clean[s : s + chunk], lse[1, s : s + chunk] = _ce(
                    z_p, clean_labels[s : s + chunk]
                )
                b = acceptance_probability(z_q, z_p, temperature, top_k)
                beta[s : s + chunk] = torch.where(noisy_labels[s : s + chunk] != IGNORE, b, 0.0)
        ctx.save_for_backward(h_noisy, h_clean, weight, noisy_labels, clean_labels, lse)
        ctx.chunk = chunk
        ctx.autocast = (
            torch.get_autocast_dtype(h_noisy.device.type)
            if torch.is_autocast_enabled(h_noisy.device.type)
            else None
        )
        ctx.mark_non_differentiable(beta)
        return ce_noisy, ce_clean, beta

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_noisy: Tensor, g_clean: Tensor, _g_beta: Tensor
    ) -> tuple[Tensor | None, ...]:
        h_noisy, h_clean, weight, noisy_labels, clean_labels, lse = ctx.saved_tensors
        compute = ctx.autocast or h_noisy.dtype
        w = weight.to(compute)
        acc = _accumulate(weight.dtype)
        grad_w = torch.zeros_like(weight, dtype=acc)
        grads = []
        for k, (h, labels, g) in enumerate(
            ((h_noisy, noisy_labels, g_noisy), (h_clean, clean_labels, g_clean))
        ):
            grad_h = torch.zeros_like(h)
            for s in range(0, h.shape[0], ctx.chunk):
                hs = h[s : s + ctx.chunk].to(compute)
                z = (hs @ w.T).to(lse.dtype)
                # d ℓ / d z = softmax(z) − onehot(label), scaled by the upstream gradient
                dz = (z - lse[k, s : s + ctx.chunk, None]).exp()
                lab = labels[s : s + ctx.chunk]
                ok = lab != IGNORE
                dz.scatter_add_(-1, lab.clamp(min=0)[:, None], -ok.to(dz.dtype)[:, None])
                dz *= torch.where(ok, g[s : s + ctx.chunk], 0.0)[:, None]
                dz_c = dz.to(compute)
                grad_h[s : s + ctx.chunk] = (dz_c @ w).to(h.dtype)
                grad_w += (dz_c.T @ hs).to(acc)
            grads.append(grad_h)
        return grads[0], grads[1], grad_w.to(weight.dtype), None, None, None, None, None
