"""What speculative decoding returns: one request's :class:`SDOutput` and the run's
:class:`SDResult`, with the run's TPFs and acceptance profile under the names every report uses
(:mod:`brisk.mechanism.runs`, the speculative family: every verify round is a complete cycle of
L + 1 tokens and one target forward), so ``brisk decode`` prints an ISD run and a drafter's run
alike. What it is asked, :class:`SDOptions`, is declared beside every decoder's options
(:mod:`brisk.runtime.decode_options`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from brisk.mechanism.runs import RunTPF
from brisk.runtime.decode_options import DRAFT_LAWS, DraftLaw, SDOptions
from brisk.theory.profile import AcceptanceProfile

__all__ = ["DRAFT_LAWS", "DraftLaw", "SDOptions", "SDOutput", "SDResult"]


@dataclass
class SDOutput:
    """One request: its tokens (cut at EOS or the budget) and what they cost."""

    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)  # L of every round
    target_forwards: int = 0  # the prefill and one verify forward per round
    finished: str = ""  # "eos" or "length"

    @property
    def forwards(self) -> int:
        """Target forwards (the block log's request table counts these)."""
        return self.target_forwards

    @property
    def tpf(self) -> float:
        """Tokens per target forward over the whole run (the prefill's included)."""
        return len(self.tokens) / self.target_forwards if self.target_forwards else float("nan")

    def histogram(self, M: int) -> list[int]:
        """Counts of accept lengths 0..M over verify rounds."""
        return np.bincount(np.asarray(self.accept_lengths, int), minlength=M + 1).tolist()


@dataclass
class SDResult:
    """Every request's output, and the measured cost of a draft forward relative to a verify."""

    outputs: list[SDOutput]
    M: int
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def draft_cost(self) -> float:
        """ρ: the drafter's forward time ÷ the target's verify forward time (one each a round)."""
        return self.draft_seconds / self.verify_seconds if self.verify_seconds else float("nan")

    @property
    def generated(self) -> int:
        """Output tokens of all requests (cut at EOS, which is kept, or at the budget)."""
        return sum(len(o.tokens) for o in self.outputs)

    @property
    def forwards(self) -> int:
        """Target forwards of all requests: the prefills and the verify rounds."""
        return sum(o.target_forwards for o in self.outputs)

    @property
    def lengths(self) -> list[int]:
        """Each request's output length n_r."""
        return [len(o.tokens) for o in self.outputs]

    @property
    def tpf(self) -> float:
        return self.generated / max(1, self.forwards)

    @property
    def mean_accept(self) -> float:
        """E[L] over every round of every request."""
        lengths = [L for o in self.outputs for L in o.accept_lengths]
        return sum(lengths) / len(lengths) if lengths else float("nan")

    def profile(self) -> AcceptanceProfile:
        """Acceptance counts over every verify round of every request."""
        lengths = [L for o in self.outputs for L in o.accept_lengths]
        return AcceptanceProfile.from_accept_lengths(np.asarray(lengths, int), self.M)

    def run_tpf(self, level: float = 0.95, seed: int = 0) -> RunTPF:
        """The run's TPFs as a block log of it reports them: whole run (output tokens ÷ target
        forwards), complete cycles (Σ (L + 1) ÷ verify rounds) and the speculative renewal
        formula at the rounds' profile."""
        lengths = [L for o in self.outputs for L in o.accept_lengths]
        return RunTPF.from_counts(
            requests=len(self.outputs),
            output_tokens=self.generated,
            forwards=self.forwards,
            cycle_tokens=sum(L + 1 for L in lengths),
            cycle_forwards=len(lengths),
            cycle_profile=self.profile(),
            level=level,
            seed=seed,
            decoder="speculative",
        )
