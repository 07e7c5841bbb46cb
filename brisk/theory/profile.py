"""Acceptance profiles estimated from verification outcomes, with their uncertainty.

Position i (1-based in the paper, index i − 1 here) is *reached* when verification gets to it,
i.e. when every earlier proposal of the block was accepted; its acceptance rate is
a_i = accepted_i / reached_i (paper, app:training_details: one minus the rejection rate among
blocks that reach it). Positions after the first rejection are not reached and say nothing
about a_i.
A position no block reached has an undefined rate: NaN, and the full interval [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from brisk.theory._arrays import FloatArray, is_tensor
from brisk.theory.tpf import CostModel, _check_M, tpf

__all__ = ["AcceptanceProfile", "ProfileTracker", "TPFInterval"]

IntArray = npt.NDArray[np.int64]


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level: must lie strictly between 0 and 1, got {level!r}")


def _integer_array(x: Any, name: str) -> IntArray:
    arr = x.detach().cpu().numpy() if is_tensor(x) else np.asarray(x)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    raise ValueError(f"{name}: expected integer counts or lengths, got dtype {arr.dtype}")


def _check_draws(draws: int) -> None:
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws: need a positive integer, got {draws!r}")


def _median_interval(samples: FloatArray, level: float) -> tuple[float, float, float]:
    """(median, low, high): the median of ``samples`` and their equal-tailed ``level`` interval."""
    low, median, high = np.quantile(samples, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return float(median), float(low), float(high)


@dataclass(frozen=True)
class _DrawnInterval:
    """The equal-tailed ``level`` interval [``low``, ``high``] of a quantity over ``draws``
    simulated values, beside ``plugin``, the quantity at the MLE rates. Each public subclass
    adds the draws' median as its first field, from a one-field base listed after this one
    (a dataclass takes its bases' fields in reverse MRO order)."""

    low: float
    high: float
    level: float
    draws: int
    plugin: float

    def _describe(self, median: float, kind: str, interval: str) -> str:
        """``median [low, high] (<kind> median, <pct>% <interval> interval)``."""
        pct = round(100 * self.level)
        return (
            f"{median:.3f} [{self.low:.3f}, {self.high:.3f}] "
            f"({kind} median, {pct}% {interval} interval)"
        )


@dataclass(frozen=True)
class _Estimate:
    estimate: float


@dataclass(frozen=True)
class TPFInterval(_DrawnInterval, _Estimate):
    """TPF's posterior median and equal-tailed credible interval, from the same draws:
    ``TPFInterval(estimate, low, high, level, draws, plugin)``.

    ``estimate`` is the median of the posterior draws, so it always lies inside
    [``low``, ``high``]. ``plugin`` is TPF at the MLE rates: near TPF's maximum it can lie
    above the whole interval (a position accepted in every block has MLE rate 1, which no
    posterior draw reaches), which is why it is not the point shown beside the interval.
    """

    def __str__(self) -> str:
        return self._describe(self.estimate, "posterior", "credible")


@dataclass(frozen=True, eq=False)
class AcceptanceProfile:
    """Counts ``reached[i]`` and ``accepted[i]`` (int64, M positions).

    >>> p = AcceptanceProfile.from_accept_lengths([0, 2, 3, 3], M=3)
    >>> p.reached.tolist(), p.accepted.tolist()
    ([4, 3, 3], [3, 3, 2])
    >>> p.rates().round(3).tolist()
    [0.75, 1.0, 0.667]
    """

    reached: IntArray
    accepted: IntArray
    M: int = field(init=False)

    def __post_init__(self) -> None:
        reached = _integer_array(self.reached, "reached")
        accepted = _integer_array(self.accepted, "accepted")
        if reached.ndim != 1 or reached.size == 0:
            raise ValueError(f"reached: expected shape [M] with M ≥ 1, got {reached.shape}")
        if accepted.shape != reached.shape:
            raise ValueError(f"accepted: expected shape {reached.shape}, got {accepted.shape}")
        if (accepted < 0).any():
            raise ValueError(f"accepted: counts must be ≥ 0, got {accepted.tolist()}")
        if (accepted > reached).any():
            i = int(np.argmax(accepted > reached))
            raise ValueError(
                f"accepted: position {i + 1} accepted {accepted[i]} of only {reached[i]} reached"
            )
        for arr in (reached, accepted):
            arr.setflags(write=False)
        object.__setattr__(self, "reached", reached)
        object.__setattr__(self, "accepted", accepted)
        object.__setattr__(self, "M", reached.size)

    @classmethod
    def empty(cls, M: int) -> AcceptanceProfile:
        """No observations at M positions."""
        _check_M(M)
        zeros = np.zeros(M, dtype=np.int64)
        return cls(zeros, zeros.copy())

    @classmethod
    def from_accept_lengths(cls, lengths: Any, M: int) -> AcceptanceProfile:
        """Counts from accepted-prefix lengths L ∈ [0, M] (any shape).

        Position i is reached iff L ≥ i − 1 and accepted iff L ≥ i; L = M means every
        position was reached and accepted.
        """
        _check_M(M)
        L = _integer_array(lengths, "lengths").ravel()
        if L.size and (L.min() < 0 or L.max() > M):
            bad = int(np.argmax((L < 0) | (L > M)))
            raise ValueError(f"lengths: entry {bad} is {L[bad]}, outside [0, M = {M}]")
        at_least = np.cumsum(np.bincount(L, minlength=M + 1)[::-1])[::-1]  # #{L ≥ k}, k=0..M
        return cls(at_least[:M].copy(), at_least[1:].copy())

    @classmethod
    def from_matches(cls, matches: Any) -> AcceptanceProfile:
        """Counts from a greedy-match matrix ``[..., M]`` under the first-rejection rule.

        Entry (b, i) says whether proposal i of block b matches the verifier; only the
        leading run of matches is accepted, everything after the first mismatch is unreached.
        """
        m = _integer_array(matches, "matches")
        if m.ndim == 0 or m.shape[-1] == 0:
            raise ValueError(f"matches: expected shape [..., M] with M ≥ 1, got {m.shape}")
        if ((m != 0) & (m != 1)).any():
            raise ValueError("matches: expected booleans (0/1)")
        lengths = np.cumprod(m, axis=-1).sum(axis=-1)
        return cls.from_accept_lengths(lengths, m.shape[-1])

    def __add__(self, other: AcceptanceProfile) -> AcceptanceProfile:
        if not isinstance(other, AcceptanceProfile):
            return NotImplemented
        if other.M != self.M:
            raise ValueError(f"other: cannot merge a profile of M = {other.M} into M = {self.M}")
        return AcceptanceProfile(self.reached + other.reached, self.accepted + other.accepted)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AcceptanceProfile):
            return NotImplemented
        return bool(
            np.array_equal(self.reached, other.reached)
            and np.array_equal(self.accepted, other.accepted)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def n_blocks(self) -> int:
        """Blocks observed (every block reaches position 1)."""
        return int(self.reached[0])

    def rates(self) -> FloatArray:
        """MLE a_i = accepted_i / reached_i; NaN where position i was never reached."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.reached > 0, self.accepted / np.maximum(self.reached, 1), np.nan)

    def posterior_mean(self) -> FloatArray:
        """Jeffreys posterior mean (accepted + ½) / (reached + 1): defined everywhere."""
        return (self.accepted + 0.5) / (self.reached + 1.0)

    def interval(self, level: float = 0.95) -> tuple[FloatArray, FloatArray]:
        """Equal-tailed Jeffreys interval per position: Beta(accepted + ½, rejected + ½).

        As usual for Jeffreys intervals the lower end is 0 when nothing was accepted and the
        upper end is 1 when everything was; an unreached position gets [0, 1].
        """
        from scipy import stats  # ~0.5 s to import: only when an interval is asked for

        _check_level(level)
        x, n = self.accepted, self.reached
        tail = (1 - level) / 2
        low = np.where(x == 0, 0.0, stats.beta.ppf(tail, x + 0.5, n - x + 0.5))
        high = np.where(x == n, 1.0, stats.beta.ppf(1 - tail, x + 0.5, n - x + 0.5))
        return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)

    def tpf(self, cost: CostModel | None = None) -> float:
        """TPF at the MLE rates (``cost=None``: ISD at stride M + 1).

        An unreached position matters only if the estimated survival before it is positive;
        then TPF is undefined (NaN). Positions behind an estimated a = 0 are irrelevant.
        """
        rates = self.usable_rates()
        return float("nan") if rates is None else float(tpf(rates, cost))

    def usable_rates(self) -> FloatArray | None:
        """The MLE rates with unreached positions behind an estimated a = 0 set to 0 (they
        cannot matter), or None when a position that matters was never reached."""
        if self.n_blocks == 0:
            return None
        rates = self.rates()
        survival_before = np.concatenate([[1.0], np.cumprod(np.nan_to_num(rates))[:-1]])
        if np.any(np.isnan(rates) & (survival_before > 0)):
            return None
        return np.nan_to_num(rates)

    def posterior_draws(self, draws: int, rng: np.random.Generator) -> FloatArray:
        """``[draws, M]`` profiles from the Jeffreys posterior a_i ~ Beta(accepted_i + ½,
        rejected_i + ½), independent across positions (each count comes from its own
        Bernoulli trials)."""
        x, n = self.accepted, self.reached
        return rng.beta(x + 0.5, n - x + 0.5, size=(draws, self.M))

    def tpf_interval(
        self,
        cost: CostModel | None = None,
        level: float = 0.95,
        draws: int = 10_000,
        seed: int = 0,
    ) -> TPFInterval:
        """Posterior median and credible interval for TPF, sampling
        a_i ~ Beta(accepted_i + ½, rejected_i + ½).

        Positions are independent a posteriori (each count comes from its own Bernoulli
        trials), so the draws are pushed through eq:nonuniform_tpf and the median and the
        equal-tailed quantiles taken; :attr:`TPFInterval.plugin` is TPF at the MLE rates.

        >>> i = AcceptanceProfile.from_accept_lengths([3] * 40, M=3).tpf_interval()
        >>> i.low <= i.estimate <= i.high < i.plugin == 4.0  # all accepted: MLE at the maximum
        True
        """
        _check_level(level)
        _check_draws(draws)
        samples = tpf(self.posterior_draws(draws, np.random.default_rng(seed)), cost)
        return TPFInterval(*_median_interval(samples, level), level, draws, self.tpf(cost))


class ProfileTracker:
    """Exponentially weighted acceptance counts for training loops.

    Each :meth:`update` decays the running counts by ``decay`` and adds the batch's counts,
    so the state is an exponential moving average of per-batch counts scaled to an effective
    window of about 1 / (1 − decay) batches: rates follow the recent profile while
    :meth:`profile` keeps a sample size that makes its intervals honest.

    >>> tracker = ProfileTracker(M=2, decay=0.5)
    >>> tracker.update(AcceptanceProfile.from_accept_lengths([0, 2], M=2))
    >>> tracker.update(AcceptanceProfile.from_accept_lengths([2, 2], M=2))
    >>> tracker.rates().round(3).tolist()
    [0.833, 1.0]
    """

    def __init__(self, M: int, decay: float = 0.99) -> None:
        _check_M(M)
        if not 0 <= decay < 1:
            raise ValueError(f"decay: must lie in [0, 1), got {decay!r}")
        self.M = M
        self.decay = decay
        self.updates = 0
        self._reached = np.zeros(M)
        self._accepted = np.zeros(M)

    def update(self, batch: AcceptanceProfile) -> None:
        """Fold in one batch's counts."""
        if batch.M != self.M:
            raise ValueError(f"batch: profile has M = {batch.M}, tracker has M = {self.M}")
        self._reached = self.decay * self._reached + batch.reached
        self._accepted = self.decay * self._accepted + batch.accepted
        self.updates += 1

    def rates(self) -> FloatArray:
        """Exponentially weighted a_i; NaN where no recent block reached position i."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self._reached > 0, self._accepted / self._reached, np.nan)

    def posterior_mean(self) -> FloatArray:
        """Jeffreys posterior mean over the weighted counts, (accepted + ½) / (reached + 1):
        defined at every position, recent batches weighing most (the profile BRISK weights
        are computed from during training)."""
        return (self._accepted + 0.5) / (self._reached + 1.0)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume the tracker exactly (for training checkpoints)."""
        return {
            "M": self.M,
            "decay": self.decay,
            "updates": self.updates,
            "reached": self._reached.tolist(),
            "accepted": self._accepted.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state (its M and decay must match this tracker's)."""
        if (state["M"], state["decay"]) != (self.M, self.decay):
            raise ValueError(
                f"state: tracker of M = {state['M']}, decay {state['decay']}; this one has "
                f"M = {self.M}, decay {self.decay}"
            )
        self.updates = int(state["updates"])
        self._reached = np.asarray(state["reached"], dtype=np.float64)
        self._accepted = np.asarray(state["accepted"], dtype=np.float64)

    def profile(self) -> AcceptanceProfile:
        """The weighted counts rounded to integers (rounding keeps accepted ≤ reached)."""
        return AcceptanceProfile(
            np.rint(self._reached).astype(np.int64), np.rint(self._accepted).astype(np.int64)
        )
