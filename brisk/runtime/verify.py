"""Exact chain verification of M draft tokens per row (speculative sampling; paper,
sec:idlm_background).

Row b drafted ``x_1..x_M`` with proposal law π_i (the law the draft was *actually* drawn from)
and the verifier gives ``p_i = p(· | prefix, x_{<i})`` for i = 1..M plus a bonus row p_{M+1}:

    accept x_i  iff  u_i · π_i(x_i) < p_i(x_i)        (probability min(1, p_i(x_i)/π_i(x_i)))
    L = number of leading acceptances (stop at the first rejection)
    next = sample normalize([p_{L+1} − π_{L+1}]₊)  if L < M   (the correction)
           sample p_{M+1}                          if L = M   (the bonus token)

so the committed tokens ``x_1..x_L, next`` are distributed exactly as autoregressive sampling from
p. Greedy mode instead accepts iff ``x_i = argmax p_i`` and takes ``next = argmax p_{L+1}``.

π comes in three forms (:class:`ProposalLaw`): a full law ``[B, M, V]``; a point mass on the
draft (argmax drafting; then acceptance is ``u < p_i(x_i)`` and the correction excludes x_i); or
a law over K candidates ``[B, M, K]`` with their ids ``[B, M, K]`` (the corrector's softmax over
Top-K candidates, any order), which is zero outside the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from brisk.runtime.sampling import sample_inverse_cdf
from brisk.theory import AcceptanceProfile

__all__ = ["ProposalLaw", "VerifyResult", "verify_chain"]


@dataclass(frozen=True)
class ProposalLaw:
    """The law π the drafts were drawn from; build with :meth:`full`, :meth:`point_mass` or
    :meth:`candidates`."""

    probs: Tensor | None  # [B, M, V] (full) or [B, M, K] (candidates); None for a point mass
    cand_ids: Tensor | None = None  # [B, M, K] when probs is a law over candidates

    @classmethod
    def full(cls, pi: Tensor) -> ProposalLaw:
        return cls(pi)

    @classmethod
    def point_mass(cls) -> ProposalLaw:
        return cls(None)

    @classmethod
    def candidates(cls, pi: Tensor, cand_ids: Tensor) -> ProposalLaw:
        if pi.shape != cand_ids.shape:
            raise ValueError(
                f"cand_ids: expected shape {tuple(pi.shape)}, got {tuple(cand_ids.shape)}"
            )
        return cls(pi, cand_ids)

    def dense(self, draft: Tensor, V: int, dtype: torch.dtype) -> Tensor:
        """π as a full law ``[B, M, V]``."""
        if self.probs is None:
            return torch.zeros(*draft.shape, V, dtype=dtype, device=draft.device).scatter_(
                -1, draft[..., None], 1.0
            )
        if self.cand_ids is None:
            return self.probs.to(dtype)
        out = torch.zeros(*self.probs.shape[:-1], V, dtype=dtype, device=self.probs.device)
        return out.scatter_add_(-1, self.cand_ids, self.probs.to(dtype))


@dataclass(frozen=True)
class VerifyResult:
    accept_len: Tensor  # [B] int64 in 0..M
    next_token: Tensor  # [B] int64: the correction (L < M) or the bonus token (L = M)
    u: Tensor  # [B, M] the acceptance uniforms used (zeros in greedy mode)

    @property
    def M(self) -> int:
        return self.u.shape[-1]

    def tokens(self, draft: Tensor) -> list[list[int]]:
        """The committed tokens of each row: accepted drafts, then the next token."""
        lengths, nxt = self.accept_len.tolist(), self.next_token.tolist()
        return [[*row[:n], t] for row, n, t in zip(draft.tolist(), lengths, nxt, strict=True)]

    def profile(self) -> AcceptanceProfile:
        return AcceptanceProfile.from_accept_lengths(self.accept_len, M=self.M)


def _check(p: Tensor, draft: Tensor) -> tuple[int, int, int]:
    if draft.ndim != 2:
        raise ValueError(f"draft: expected shape [B, M], got {tuple(draft.shape)}")
    B, M = draft.shape
    if p.ndim != 3 or p.shape[:2] != (B, M + 1):
        raise ValueError(f"p: expected shape [B, M+1, V] = [{B}, {M + 1}, V], got {tuple(p.shape)}")
    V = p.shape[-1]
    if draft.dtype != torch.long or bool(((draft < 0) | (draft >= V)).any()):
        raise ValueError(f"draft: expected int64 token ids in 0..{V - 1}")
    return B, M, V


def verify_chain(
    p: Tensor,
    draft: Tensor,
    pi: ProposalLaw,
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    u: Tensor | None = None,
    u_next: Tensor | None = None,
) -> VerifyResult:
    """Verify ``draft [B, M]`` against target probabilities ``p [B, M+1, V]`` (module docstring).

    Uniforms come from ``u [B, M]`` when given (e.g. replaying logged blocks), otherwise from
    ``generator``, and so does the correction / bonus draw from ``u_next [B]``. Same generator
    state (or same uniforms) ⇒ same result.
    """
    B, M, V = _check(p, draft)
    rows = torch.arange(B, device=p.device)
    if greedy:
        top = p.argmax(-1)  # [B, M+1]
        accepted = draft == top[:, :M]
        accept_len = accepted.long().cumprod(-1).sum(-1)
        u_used = torch.zeros(B, M, dtype=p.dtype, device=p.device)
        return VerifyResult(accept_len, top[rows, accept_len], u_used)

    dtype = p.dtype if p.dtype == torch.float64 else torch.float32
    p = p.to(dtype)
    pi_dense = pi.dense(draft, V, dtype)
    if pi_dense.shape != (B, M, V):
        raise ValueError(
            f"pi: expected a law of shape [{B}, {M}, {V}], got {tuple(pi_dense.shape)}"
        )
    p_x = p[:, :M].gather(-1, draft[..., None])[..., 0]  # [B, M]  p_i(x_i)
    pi_x = pi_dense.gather(-1, draft[..., None])[..., 0]  # [B, M]  π_i(x_i)
    if bool((pi_x <= 0).any()):
        raise ValueError("pi: a draft token has zero probability under its proposal law")
    if u is None:
        u = torch.rand(B, M, generator=generator, dtype=dtype, device=p.device)
    elif u.shape != (B, M):
        raise ValueError(f"u: expected shape [{B}, {M}], got {tuple(u.shape)}")
    accepted = u.to(dtype) * pi_x < p_x  # P(accept) = min(1, p/π)
    accept_len = accepted.long().cumprod(-1).sum(-1)  # [B]

    # Next token: residual [p − π]₊ at the first rejection, p itself at the bonus row (π = 0 there).
    pi_ext = torch.cat([pi_dense, torch.zeros(B, 1, V, dtype=dtype, device=p.device)], dim=1)
    target, proposal = p[rows, accept_len], pi_ext[rows, accept_len]  # [B, V]
    residual = (target - proposal).clamp(min=0)
    # p = π exactly would make rejection impossible; rounding can still leave an all-zero
    # residual, and then p is the right fallback (it is the law the residual approximates).
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, target)
    if u_next is None:
        u_next = torch.rand(B, generator=generator, dtype=dtype, device=p.device)
    elif u_next.shape != (B,):
        raise ValueError(f"u_next: expected shape [{B}], got {tuple(u_next.shape)}")
    u_next = u_next.to(dtype)
    return VerifyResult(accept_len, sample_inverse_cdf(residual, u_next), u.to(dtype))
