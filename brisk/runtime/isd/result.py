"""What an ISD run returns: per-request outputs and statistics, and their totals."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from brisk.mechanism.runs import RunTPF
from brisk.theory import AcceptanceProfile, CostModel, RunTPFPrediction, predict_run_tpf

__all__ = ["DecodeResult", "RequestOutput"]


@dataclass
class RequestOutput:
    """What one request produced and what it cost."""

    tokens: list[int] = field(default_factory=list)  # output, cut at EOS / the token budget
    forwards: int = 0  # forwards: the prefill (it commits the first token) and the rounds
    committed: int = 0  # tokens committed by those forwards (before the cut at EOS / budget)
    accept_lengths: list[int] = field(default_factory=list)  # L of every verify round
    cycle_tokens: int = 0  # over complete renewal cycles: verify round (+ cold start)
    cycle_forwards: int = 0
    cycle_lengths: list[int] = field(default_factory=list)  # L of complete cycles (ascending)
    finished: str = ""  # "eos" or "length"

    @property
    def tpf(self) -> float:
        """Whole-run tokens per forward: output tokens ÷ forwards (the prefill's included)."""
        return len(self.tokens) / self.forwards if self.forwards else float("nan")

    def profile(self, M: int) -> AcceptanceProfile:
        return AcceptanceProfile.from_accept_lengths(np.asarray(self.accept_lengths, int), M)

    def output_profile(self, M: int) -> AcceptanceProfile:
        """Acceptance counts over the positions that fall inside the output.

        Replays the decoder's forwards (the prefill and a cold start commit one token each; a
        verify round with accept length L commits L + 1): with c tokens committed before a
        verify round and a response of n tokens, proposal slot i lands on output token c + i,
        so only slots i ≤ r = n − c can matter; a rejection past the response's end (a round
        that drafts beyond EOS or the budget) costs nothing and is not counted. This is the
        profile the finite-horizon prediction needs: the all-round :meth:`profile` counts those
        free rejections and understates whole-run TPF.
        """
        n, committed, warm, reached, accepted = len(self.tokens), 1, False, [], []  # prefill
        rounds = iter(self.accept_lengths)
        while committed < n:
            if not warm:
                committed, warm = committed + 1, True
                continue
            L = next(rounds)
            r = n - committed
            reached.append(min(L + 1, M, r))
            accepted.append(min(L, r))
            committed, warm = committed + L + 1, L == M
        i = np.arange(1, M + 1)
        reach, acc = np.asarray(reached, int)[:, None], np.asarray(accepted, int)[:, None]
        return AcceptanceProfile((i <= reach).sum(0), (i <= acc).sum(0))

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
    def generated(self) -> int:
        """Output tokens of all requests (cut at EOS, which is kept, or at the token budget)."""
        return sum(len(r.tokens) for r in self.requests)

    @property
    def lengths(self) -> list[int]:
        """Each request's output length n_r."""
        return [len(r.tokens) for r in self.requests]

    @property
    def tpf(self) -> float:
        """Whole-run tokens per forward: Σ_r n_r ÷ Σ_r F_r, output tokens over forwards, the
        prefill's included (it commits the first token: autoregressive decoding has TPF 1).
        Each request's cold start and its unfinished last cycle are in it, and drafts
        committed past EOS or the budget are not."""
        return self.generated / self.forwards if self.forwards else float("nan")

    @property
    def cycle_tpf(self) -> float:
        """Measured tokens per forward over complete renewal cycles only (a verify round, plus
        the cold start after a rejection): what eq:idlm_tpf_instantiation describes."""
        tokens = sum(r.cycle_tokens for r in self.requests)
        forwards = sum(r.cycle_forwards for r in self.requests)
        return tokens / forwards if forwards else float("nan")

    def profile(self) -> AcceptanceProfile:
        """Acceptance counts over every verify round of every request."""
        total = AcceptanceProfile.empty(self.M)
        for r in self.requests:
            total = total + r.profile(self.M)
        return total

    def output_profile(self) -> AcceptanceProfile:
        """Acceptance counts inside the outputs (see :meth:`RequestOutput.output_profile`): the
        profile that predicts whole-run TPF, here or on another run."""
        total = AcceptanceProfile.empty(self.M)
        for r in self.requests:
            total = total + r.output_profile(self.M)
        return total

    def cycle_profile(self) -> AcceptanceProfile:
        lengths = [L for r in self.requests for L in r.cycle_lengths]
        return AcceptanceProfile.from_accept_lengths(np.asarray(lengths, int), self.M)

    def cycle_renewal_tpf(self) -> float:
        """ISD TPF (eq:idlm_tpf_instantiation) at the plug-in profile of the complete cycles.
        The renewal-reward identity makes it equal :attr:`cycle_tpf`: a check of the loop's
        bookkeeping. :meth:`run_tpf` has it with its uncertainty, :meth:`predicted_run_tpf`
        predicts the whole-run TPF."""
        return self.cycle_profile().tpf(CostModel.isd(self.M))

    def run_tpf(self, level: float = 0.95, seed: int = 0) -> RunTPF:
        """The run's TPFs under the names every report uses (:mod:`brisk.mechanism.runs`):
        whole run, complete cycles, and renewal theory at the complete cycles' profile (a
        posterior median and ``level`` credible interval). A block log of this run reports the
        same values."""
        return RunTPF.from_counts(
            requests=len(self.requests),
            output_tokens=self.generated,
            forwards=self.forwards,
            cycle_tokens=sum(r.cycle_tokens for r in self.requests),
            cycle_forwards=sum(r.cycle_forwards for r in self.requests),
            cycle_profile=self.cycle_profile(),
            level=level,
            seed=seed,
        )

    def predicted_run_tpf(
        self,
        profile: AcceptanceProfile | None = None,
        level: float = 0.95,
        draws: int = 400,
        seed: int = 0,
    ) -> RunTPFPrediction:
        """The whole-run TPF that finite-horizon renewal predicts for this run's output lengths.

        ``profile`` defaults to this run's own :meth:`output_profile`; pass one measured on
        another run (its ``output_profile()``) to predict this one. The interval covers the
        profile's posterior and the randomness of the run (see
        :func:`brisk.theory.predict_run_tpf`).
        """
        use = self.output_profile() if profile is None else profile
        if use.M != self.M:
            raise ValueError(f"profile: has M = {use.M}, this run has M = {self.M}")
        return predict_run_tpf(use, self.lengths, level=level, draws=draws, seed=seed)
