"""Bookkeeping of a batched ISD run: per-row KV validity, per-request outputs and statistics.

Rows of one batch share a physical KV cache but not a history: each row marks which physical
slots it still owns (rejected proposals and MASK slots are dropped by clearing their bits), and
feeds its new slots at its own logical positions. A slot always attends to itself, so padding
rows never produce an all-masked attention row (and NaNs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from brisk.theory import AcceptanceProfile, CostModel

__all__ = ["DecodeResult", "KVSlots", "RequestOutput"]


class KVSlots:
    """Which physical cache slots each row owns, and each row's logical length."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # [B, T]
        self.length = torch.zeros(batch, dtype=torch.long, device=device)  # [B] logical

    @property
    def physical(self) -> int:
        return int(self.valid.shape[1])

    def attention(self, new_valid: Tensor) -> tuple[Tensor, Tensor]:
        """Boolean mask ``[B, 1, S, T + S]`` and position ids ``[B, S]`` for S new slots.

        New slot s of row b sees the row's owned cache slots and its own valid new slots
        s' ≤ s (causal), and always itself.
        """
        B, S = new_valid.shape
        T = self.physical
        causal = torch.ones(S, S, dtype=torch.bool, device=new_valid.device).tril()
        new = (causal[None] & new_valid[:, None, :]) | torch.eye(
            S, dtype=torch.bool, device=new_valid.device
        )
        old = self.valid[:, None, :].expand(B, S, T)
        mask = torch.cat([old, new], dim=-1)[:, None]
        positions = self.length[:, None] + torch.arange(S, device=new_valid.device)
        return mask, positions

    def append(self, keep: Tensor) -> None:
        """Record the new slots a forward appended: ``keep [B, S]`` marks those rows keep."""
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.length += keep.sum(1)

    def compact(self) -> int:
        """Physical length that still holds an owned slot (the cache can be cropped to it)."""
        owned = self.valid.any(0).nonzero()
        keep = int(owned[-1]) + 1 if len(owned) else 0
        self.valid = self.valid[:, :keep]
        return keep


@dataclass
class RequestOutput:
    """What one request produced and what it cost."""

    tokens: list[int] = field(default_factory=list)  # output, cut at EOS / the token budget
    forwards: int = 0  # decoding forwards (prefill excluded)
    committed: int = 0  # tokens committed by those forwards (before any cut)
    accept_lengths: list[int] = field(default_factory=list)  # L of every verify round
    cycle_tokens: int = 0  # over complete renewal cycles: verify round (+ cold start)
    cycle_forwards: int = 0
    cycle_lengths: list[int] = field(default_factory=list)  # L of complete cycles
    open_cycle: tuple[int, int, int] | None = None  # (L, tokens, forwards) awaiting cold start
    finished: str = ""  # "eos" or "length"

    @property
    def tpf(self) -> float:
        return self.committed / self.forwards if self.forwards else float("nan")

    def profile(self, M: int) -> AcceptanceProfile:
        return AcceptanceProfile.from_accept_lengths(np.asarray(self.accept_lengths, int), M)

    def histogram(self, M: int) -> list[int]:
        """Counts of accept lengths 0..M over verify rounds."""
        return np.bincount(np.asarray(self.accept_lengths, int), minlength=M + 1).tolist()


@dataclass(frozen=True)
class DecodeResult:
    """All requests of a :func:`brisk.runtime.isd.decode` call, in prompt order."""

    requests: list[RequestOutput]
    M: int

    @property
    def tokens(self) -> list[list[int]]:
        return [r.tokens for r in self.requests]

    @property
    def forwards(self) -> int:
        return sum(r.forwards for r in self.requests)

    @property
    def committed(self) -> int:
        return sum(r.committed for r in self.requests)

    @property
    def tpf(self) -> float:
        """Measured tokens per forward over the whole run (start-up and last rounds included)."""
        return self.committed / self.forwards if self.forwards else float("nan")

    @property
    def cycle_tpf(self) -> float:
        """Measured tokens per forward over complete renewal cycles only."""
        tokens = sum(r.cycle_tokens for r in self.requests)
        forwards = sum(r.cycle_forwards for r in self.requests)
        return tokens / forwards if forwards else float("nan")

    def profile(self) -> AcceptanceProfile:
        """Acceptance counts over every verify round of every request."""
        total = AcceptanceProfile.empty(self.M)
        for r in self.requests:
            total = total + r.profile(self.M)
        return total

    def cycle_profile(self) -> AcceptanceProfile:
        lengths = [L for r in self.requests for L in r.cycle_lengths]
        return AcceptanceProfile.from_accept_lengths(np.asarray(lengths, int), self.M)

    def predicted_tpf(self) -> float:
        """ISD TPF (appendix eq. 7) at the profile of the complete cycles."""
        return self.cycle_profile().tpf(CostModel.isd(self.M))
