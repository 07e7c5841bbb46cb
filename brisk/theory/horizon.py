"""Whole-run tokens per forward of ISD over responses of finite length.

The ISD TPF (paper, eq:idlm_tpf_instantiation, an instance of eq:nonuniform_tpf) is a
renewal-reward limit: tokens per forward over complete cycles, a verify round plus the cold
start that follows a rejection. A response of n tokens is not made of complete cycles: it opens
with the prefill and a cold start of its own, and its last cycle is cut at n. What a decoder
reports, total output tokens over total forwards (the prefill included), is this module's
*run TPF*. An autoregressive decoder has run TPF exactly 1.

The decoder's state machine (:func:`brisk.runtime.isd.batched.first_step` and
:func:`brisk.runtime.isd.batched.step`, SGLang's serving loop), per request:

- **prefill**: the forward over the whole prompt; 1 forward, commits 1 token (the first output
  token, drawn from the prompt's last logits); the next forward is a cold start.
- **cold start** (the forward after the prefill, and the one after every rejection):
  1 forward, commits 1 token (the verifier's next token); the next forward verifies.
- **verify round**: 1 forward over M = N − 1 proposals with accept length L,
  Pr(L = k) = A_k (1 − a_{k+1}) for k < M and A_M for k = M (eq:nonuniform_tpf). It commits
  L + 1 tokens: the L accepted proposals and the verifier's token at position L + 1 (the bonus
  token when L = M, the correction when L < M). After L = M the next forward verifies again;
  after L < M it is a cold start.
- **stop**: after the forward at which the committed count first reaches the response length
  n (its EOS or the token budget), so a response of 1 token costs the prefill alone. Tokens
  committed past n are not output (``RoundStats`` counts them in ``committed``, the output and
  ``DecodeResult.tpf`` do not).

The prefill commits exactly one token, so F(n), the forwards of a response of n tokens, is
F(0) = 0 and F(n) = 1 + F_cold(n − 1) for n ≥ 1, where F_cold(m) counts the forwards of m tokens
decoded from a cold start. Write v_c(t), v_w(t) for the probability that, between two forwards
after the prefill, exactly t tokens have been committed after the prefill's and the next forward
is a cold start / a verify round. Every forward commits at least one token, so each t is passed
at most once and F_cold(m) counts the t < m that are passed:

    E[F(n)]       = 1 + E[F_cold(n − 1)]  (n ≥ 1),   E[F(0)] = 0,
    E[F_cold(m)]  = Σ_{t=0}^{m−1} (v_c(t) + v_w(t)),   v_c(0) = 1,  v_w(0) = 0,
    v_w(t)        = v_c(t − 1) + Pr(L = M) v_w(t − M − 1),
    v_c(t)        = Σ_{k=0}^{M−1} Pr(L = k) v_w(t − k − 1)      (t ≥ 1; v = 0 at t < 0).

Over responses of lengths n_1..n_R the run TPF is Σ_r n_r / Σ_r E[F(n_r)]: the ratio the decoder
reports, in expectation over each request's forwards (a ratio of expectations, which is what
Σ tokens / Σ forwards tends to over many requests). The lengths are taken as given: accept
lengths are assumed independent of where a response ends (its EOS, or the budget).

Which profile to feed it: a verify round with r output tokens still to come can only use
slots 1..r, and a rejection beyond slot r (drafting past EOS) costs nothing. A profile that
counts every slot of every round charges those free rejections and predicts too low. Count
only slots inside the output: :meth:`brisk.runtime.isd.DecodeResult.output_profile` does.

As n → ∞ it tends to the renewal TPF. Write T = TPF(a) ≥ 1. From a cold start, a response of
m ≥ 1 tokens costs that cold start (1 token), then runs complete cycles (L = M: M + 1 tokens,
1 forward; L < M: L + 2 tokens, 2 forwards; at most M + 1 tokens each) up to the cycle τ at
which the count after the cold start S_τ first reaches m − 1, so m − 1 ≤ S_τ ≤ m + M − 1; the
last cycle's cold start is skipped when its verify round already reaches m, which saves at most
one forward. Wald's identity, E[S_τ] = E[τ]·E[tokens a cycle] and the cycles' forwards
E[τ]·E[forwards a cycle] = E[S_τ]/T, gives (m − 1)/T ≤ E[F_cold(m)] ≤ 1 + (m + M − 1)/T, and
with the prefill in front (m = n − 1; at n = 1 both sides hold directly, F(1) = 1):

    1 + (n − 2)/T ≤ E[F(n)] ≤ 2 + (n + M − 2)/T          (n ≥ 1),

so −(2T + M − 2) ≤ n − T·E[F(n)] ≤ 2 − T and |n / E[F(n)] − T| ≤ (2T + M − 2) / E[F(n)].
Short responses make the gap wide: each pays the prefill, a whole cold start and, on average,
part of an unfinished cycle.

Shapes: ``a`` is ``[..., M]``; results are batched over the leading dims. ISD only (the
speculative cost model has no cold starts).

>>> from brisk.theory import tpf
>>> round(float(tpf([0.9] * 7)), 3)  # complete cycles, N = 8, 10 % rejection
4.086
>>> [round(float(run_tpf([0.9] * 7, [n])), 3) for n in (16, 256, 10_000)]  # whole runs
[2.745, 3.963, 4.082]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import numpy.typing as npt

from brisk.theory._arrays import (
    Array,
    ArrayInput,
    FloatArray,
    concat,
    cumsum,
    stack,
    to_kind,
    to_numpy,
    values_like,
)
from brisk.theory.profile import (
    AcceptanceProfile,
    _check_draws,
    _check_level,
    _DrawnInterval,
    _integer_array,
    _median_interval,
)
from brisk.theory.tpf import _pmf, read_profile

if TYPE_CHECKING:
    import torch

__all__ = [
    "RunSimulation",
    "RunTPFPrediction",
    "expected_forwards",
    "predict_run_tpf",
    "run_tpf",
    "simulate_run",
]

IntArray = npt.NDArray[np.int64]

SIMULATION_LANES = 1 << 20
"""Requests simulated side by side in one pass of :func:`predict_run_tpf` (bounds memory)."""


def _read_lengths(lengths: Any) -> IntArray:
    """Response lengths n_r ≥ 1 as a flat int64 array (any shape in)."""
    n = _integer_array(lengths, "lengths").ravel()
    if n.size == 0:
        raise ValueError("lengths: need at least one response length")
    if n.min() < 1:
        bad = int(np.argmax(n < 1))
        raise ValueError(f"lengths: every response has n ≥ 1 tokens; entry {bad} is {n[bad]}")
    return n


def _cold_forwards(a: Array, m_max: int) -> Array:
    """E[F_cold(m)] for m = 0..m_max (module docstring): the forwards of m tokens decoded from
    a cold start, ``[..., M]`` → ``[..., m_max + 1]``.

    Numpy or torch. Python lists of per-t arrays rather than writes into one buffer, so that
    torch's autograd can follow.
    """
    M = a.shape[-1]
    pmf = _pmf(a)
    p = [pmf[..., k] for k in range(M + 1)]  # Pr(L = k), each [...]
    zero = a[..., 0] * 0
    if m_max == 0:
        return zero[..., None]
    v_c, v_w = [zero + 1], [zero]  # t = 0: nothing committed, a cold start next
    for t in range(1, m_max):
        v_w.append(v_c[t - 1] + (p[M] * v_w[t - M - 1] if t > M else zero))
        v_c.append(sum((p[k] * v_w[t - k - 1] for k in range(min(M, t))), zero))
    passed = stack([c + w for c, w in zip(v_c, v_w, strict=True)])  # [..., m_max]
    return concat([zero[..., None], cumsum(passed)])


def _expected_forwards(a: Array, n_max: int) -> Array:
    """E[F(n)] for n = 0..n_max (module docstring): 0 at n = 0, then the prefill (which commits
    the first token) plus a cold-start decode of the other n − 1, ``1 + E[F_cold(n − 1)]``.
    ``[..., M]`` → ``[..., n_max + 1]``, numpy or torch (autograd follows)."""
    zero = a[..., 0] * 0
    if n_max == 0:
        return zero[..., None]
    return concat([zero[..., None], 1 + _cold_forwards(a, n_max - 1)])


def _check_n_max(n_max: int) -> None:
    if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 0:
        raise ValueError(f"n_max: need an integer ≥ 0, got {n_max!r}")


@overload
def expected_forwards(a: torch.Tensor, n_max: int) -> torch.Tensor: ...
@overload
def expected_forwards(a: ArrayInput, n_max: int) -> FloatArray: ...
def expected_forwards(a: ArrayInput | torch.Tensor, n_max: int) -> FloatArray | torch.Tensor:
    """E[F(n)], the expected ISD forwards of a response of n tokens, the prefill included (it
    commits the first token; a cold start follows), for every n = 0..n_max (exact, module
    docstring). a: ``[..., M]`` → ``[..., n_max + 1]``.

    >>> expected_forwards([1.0, 1.0, 1.0], 9).tolist()  # prefill, cold start, 4 tokens a forward
    [0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0]
    """
    t, kind = read_profile(a)
    _check_n_max(n_max)
    return to_kind(_expected_forwards(t, n_max), kind)  # type: ignore[no-any-return]


@overload
def run_tpf(a: torch.Tensor, lengths: Any) -> torch.Tensor: ...
@overload
def run_tpf(a: ArrayInput, lengths: Any) -> FloatArray: ...
def run_tpf(a: ArrayInput | torch.Tensor, lengths: Any) -> FloatArray | torch.Tensor:
    """Whole-run TPF Σ_r n_r / Σ_r E[F(n_r)] over responses of ``lengths`` n_r ≥ 1 (any shape),
    forwards counting each response's prefill (which commits its first token).

    a: ``[..., M]`` → ``[...]``. Tends to :func:`brisk.theory.tpf` (ISD) as every n_r → ∞.
    """
    t, kind = read_profile(a)
    n = _read_lengths(lengths)
    counts = np.bincount(n).astype(np.float64)  # how many responses have each length
    forwards = (_expected_forwards(t, int(n.max())) * values_like(counts, t)).sum(-1)
    return to_kind(float(n.sum()) / forwards, kind)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RunSimulation:
    """Simulated forwards of each response, batched like the profile: ``forwards [..., R]``."""

    forwards: Any
    lengths: IntArray

    @property
    def tpf(self) -> Any:
        """Whole-run TPF per profile, Σ_r n_r / Σ_r F_r: ``[...]``."""
        return float(self.lengths.sum()) / self.forwards.sum(-1)


def _simulate_forwards(
    cdf: FloatArray, n: IntArray, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Forwards ``[D, R]`` of responses of lengths ``n [R]`` under D profiles given by the
    cdf of L, ``cdf [D, M]`` = Pr(L ≤ k) for k = 0..M − 1. Runs every (profile, response) lane
    through the state machine at once and drops lanes as they finish."""
    D, M = cdf.shape
    R = n.size
    forwards = np.ones(D * R, dtype=np.int64)  # the prefill, which commits the first token
    lane = np.arange(D * R)
    draw, target = lane // R, n[lane % R]
    committed = np.ones(D * R, dtype=np.int64)
    verify = np.zeros(D * R, dtype=bool)  # after the prefill, a cold start
    while True:
        going = committed < target
        lane, draw, target = lane[going], draw[going], target[going]
        committed, verify = committed[going], verify[going]
        if not lane.size:
            break
        forwards[lane] += 1
        L = (rng.random(lane.size)[:, None] >= cdf[draw]).sum(-1)  # inverse cdf
        committed += np.where(verify, L + 1, 1)
        verify = ~verify | (L == M)  # cold start → verify; verify → verify iff L = M
    return forwards.reshape(D, R)


def simulate_run(
    a: ArrayInput | torch.Tensor,
    lengths: Any,
    *,
    seed: int | np.random.Generator = 0,
) -> RunSimulation:
    """Monte Carlo of the decoder's state machine (module docstring): one response of each
    length in ``lengths`` for every profile in a: ``[..., M]``, each opened by the prefill
    (1 forward, the first token) and then a cold start.

    Returns the forwards ``[..., R]`` in the input's kind (no gradient). ``seed``: an integer,
    or a numpy Generator to draw from.
    """
    t, kind = read_profile(a)
    n = _read_lengths(lengths)
    pmf = _pmf(to_numpy(t).astype(np.float64))
    flat = pmf.reshape(-1, pmf.shape[-1])
    cdf = np.cumsum(flat, axis=-1)[:, :-1] / flat.sum(-1, keepdims=True)
    forwards = _simulate_forwards(cdf, n, np.random.default_rng(seed))
    return RunSimulation(to_kind(forwards.reshape(*pmf.shape[:-1], n.size), kind), n)


@dataclass(frozen=True)
class _Point:
    point: float


@dataclass(frozen=True)
class RunTPFPrediction(_DrawnInterval, _Point):
    """Predicted whole-run TPF for given response lengths:
    ``RunTPFPrediction(point, low, high, level, draws, plugin)``, the predictive median and an
    equal-tailed predictive interval from the same simulated runs (so ``point`` always lies
    inside [``low``, ``high``]), and ``plugin``, :func:`run_tpf` at the MLE rates."""

    def __str__(self) -> str:
        return self._describe(self.point, "predictive", "predictive")


def predict_run_tpf(
    profile: AcceptanceProfile,
    lengths: Any,
    *,
    level: float = 0.95,
    draws: int = 1000,
    seed: int | np.random.Generator = 0,
) -> RunTPFPrediction:
    """The whole-run TPF a run with responses of ``lengths`` should report, given a measured
    acceptance ``profile``.

    The prediction is a distribution: it draws profiles from the Jeffreys posterior
    a_i ~ Beta(accepted_i + ½, rejected_i + ½), runs the decoder's state machine over
    ``lengths`` once per draw (:func:`simulate_run`), and takes the median (``point``) and the
    equal-tailed ``level`` quantiles of the simulated Σ_r n_r / Σ_r F_r. It so covers both the
    uncertainty of the profile and the randomness of the run itself. ``plugin`` is
    :func:`run_tpf` at the profile's MLE rates (NaN when a position that matters was never
    reached): the expected run TPF if the MLE were the truth, which near TPF's maximum can lie
    outside the interval.
    """
    if not isinstance(profile, AcceptanceProfile):
        raise ValueError(f"profile: expected an AcceptanceProfile, got {type(profile).__name__}")
    n = _read_lengths(lengths)
    _check_level(level)
    _check_draws(draws)
    rng = np.random.default_rng(seed)
    rates = profile.usable_rates()
    plugin = math.nan if rates is None else float(run_tpf(rates, n))
    chunk = max(1, SIMULATION_LANES // n.size)
    totals = []
    for start in range(0, draws, chunk):
        a = profile.posterior_draws(min(chunk, draws - start), rng)
        totals.append(simulate_run(a, n, seed=rng).tpf)
    samples = np.concatenate(totals)
    return RunTPFPrediction(*_median_interval(samples, level), level, draws, plugin)
