"""The TPFs of a decoding run: each has one name, and is computed the same way wherever it is
shown (``brisk decode``'s summary, the mechanism report's table, JSON and plots).

- **TPF, whole run** — Σ_r n_r / Σ_r F_r: output tokens (cut at EOS or the budget) over
  forwards, the prefill included (it commits the first token, as in SGLang's serving loop), so
  an autoregressive decoder has exactly 1. What a user of the decoder gets;
  :func:`brisk.theory.run_tpf` is its expectation under a profile.
- **TPF, complete cycles** — tokens over forwards of complete renewal cycles only, which is why
  it exceeds the whole-run TPF. Under ISD a cycle is a verify round that accepts all M
  proposals (M + 1 tokens, 1 forward), or one that rejects at L < M together with the cold
  start that follows it (L + 2 tokens, 2 forwards); each request's prefill, its opening cold
  start and its unfinished last cycle are left out. Under speculative decoding every verify
  round is a complete cycle (L + 1 tokens, 1 target forward), so it is Σ(L + 1) / R over the
  rounds, only the prefill left out. By the renewal-reward identity it equals the renewal
  formula of the family's cost model (:func:`cost_model`) at the plug-in profile of the same
  cycles.
- **TPF, renewal theory** — that formula (eq:idlm_tpf_instantiation for ISD) at the complete
  cycles' acceptance profile, as the posterior median and credible interval of
  :meth:`brisk.theory.AcceptanceProfile.tpf_interval`: the long-run TPF the measured profile
  supports, with its uncertainty.

A decode knows all three from its own counters. A block log knows them when its directory holds
the request table (:mod:`brisk.mechanism.requests`): whole-run from the requests' output tokens
and forwards; complete cycles from the blocks' accept lengths, under ISD closing a request's
rejections with the cold starts its forwards imply (F = 1 + verify rounds + closed rejections
for a request that ends at its prefill, i.e. n = 1, else F = 2 + verify rounds + closed
rejections: the prefill and the opening cold start). The log's decoder family
(:data:`~brisk.mechanism.schema.Decoder`) says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from brisk.mechanism.requests import RequestTable
from brisk.mechanism.schema import BlockLogError, Decoder
from brisk.mechanism.tally import RequestTally
from brisk.theory import AcceptanceProfile, CostModel, TPFInterval

__all__ = [
    "ALL_ROUNDS",
    "COMPLETE_CYCLES",
    "RENEWAL",
    "WHOLE_RUN",
    "RunTPF",
    "cost_model",
    "run_tpf_of_log",
]

WHOLE_RUN = "TPF, whole run"
COMPLETE_CYCLES = "TPF, complete cycles"
RENEWAL = "TPF, renewal theory"
ALL_ROUNDS = "TPF, renewal theory at every logged round"
"""What a log without its request table still gives: the renewal formula of its family's cost
model at the profile of every logged round, none of the run's TPFs above (its prefills and cold
starts are unknown)."""
_WHOLE_MEANS: dict[str, str] = {
    "isd": "output tokens ÷ forwards, the prefill (which commits the first token) included",
    "speculative": "output tokens ÷ target forwards, the prefill (which commits the first "
    "token) included, the drafter's left out",
}
_CYCLES_MEANS: dict[str, str] = {
    "isd": "verify rounds and the cold starts after their rejections; each request's prefill, "
    "opening cold start and unfinished last cycle left out",
    "speculative": "every verify round (L + 1 tokens, 1 target forward); each request's "
    "prefill left out",
}
_RENEWAL_MEANS: dict[str, str] = {
    "isd": "ISD's renewal formula at the complete cycles' acceptance profile",
    "speculative": "speculative decoding's renewal formula (g_k = k + 1, c_k = 1) at the "
    "verify rounds' acceptance profile",
}


def cost_model(decoder: Decoder, M: int) -> CostModel:
    """The renewal cost model of a ``decoder`` family's cycles: :meth:`CostModel.isd` (g_k =
    2 + min(k, M − 1), c_k = 2 for k < M, c_M = 1), or :meth:`CostModel.speculative` with draft
    cost 0 (g_k = k + 1, c_k = 1: TPF counts target forwards). Its g_k and c_k are the tokens
    and forwards of a complete cycle with L = k.

    >>> cost_model("speculative", 2)
    CostModel(gains=(1.0, 2.0, 3.0), costs=(1.0, 1.0, 1.0))
    """
    return CostModel.isd(M) if decoder == "isd" else CostModel.speculative(M)


@dataclass(frozen=True)
class RunTPF:
    """The measured counts behind the three TPFs of a run (module docstring) and the renewal
    interval at the complete cycles' profile, under the cost model of ``decoder``'s family."""

    requests: int
    output_tokens: int
    forwards: int
    cycle_tokens: int
    cycle_forwards: int
    cycle_profile: AcceptanceProfile
    renewal: TPFInterval
    decoder: Decoder = "isd"

    @classmethod
    def from_counts(
        cls,
        *,
        requests: int,
        output_tokens: int,
        forwards: int,
        cycle_tokens: int,
        cycle_forwards: int,
        cycle_profile: AcceptanceProfile,
        level: float = 0.95,
        seed: int = 0,
        draws: int = 10_000,
        decoder: Decoder = "isd",
    ) -> RunTPF:
        """The renewal interval is computed here, with the same draws everywhere."""
        cost = cost_model(decoder, cycle_profile.M)
        renewal = cycle_profile.tpf_interval(cost, level, draws=draws, seed=seed)
        return cls(
            requests,
            output_tokens,
            forwards,
            cycle_tokens,
            cycle_forwards,
            cycle_profile,
            renewal,
            decoder,
        )

    @property
    def whole_run(self) -> float:
        return self.output_tokens / self.forwards if self.forwards else math.nan

    @property
    def complete_cycles(self) -> float:
        return self.cycle_tokens / self.cycle_forwards if self.cycle_forwards else math.nan

    def lines(self) -> list[tuple[str, str, str, str]]:
        """(name, value, counts, what it is) for each TPF, in the words of the run's decoder
        family; the renewal line only when there are complete cycles."""
        rows = [
            (
                WHOLE_RUN,
                f"{self.whole_run:.3f}",
                f"{self.output_tokens:,} tokens ÷ {self.forwards:,} forwards",
                _WHOLE_MEANS[self.decoder],
            ),
            (
                COMPLETE_CYCLES,
                f"{self.complete_cycles:.3f}",
                f"{self.cycle_tokens:,} tokens ÷ {self.cycle_forwards:,} forwards",
                _CYCLES_MEANS[self.decoder],
            ),
        ]
        if self.cycle_profile.n_blocks:
            t, pct = self.renewal, round(100 * self.renewal.level)
            rows.append(
                (
                    RENEWAL,
                    f"{t.estimate:.3f} [{t.low:.3f}, {t.high:.3f}]",
                    f"posterior median [{pct}% CI]",
                    _RENEWAL_MEANS[self.decoder],
                )
            )
        return rows

    def __str__(self) -> str:
        return "\n".join(
            f"{name}: {value} ({counts}; {what})" for name, value, counts, what in self.lines()
        )

    def to_dict(self) -> dict[str, Any]:
        r = self.renewal
        return {
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "forwards": self.forwards,
            "whole_run": _finite(self.whole_run),
            "cycle_tokens": self.cycle_tokens,
            "cycle_forwards": self.cycle_forwards,
            "complete_cycles": _finite(self.complete_cycles),
            "renewal": {
                "median": _finite(r.estimate),
                "low": _finite(r.low),
                "high": _finite(r.high),
                "level": r.level,
                "plugin": _finite(r.plugin),
            },
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def run_tpf_of_log(
    tally: RequestTally,
    table: RequestTable,
    level: float = 0.95,
    seed: int = 0,
    draws: int = 10_000,
) -> RunTPF:
    """The run's TPFs from its blocks (``tally``) and request table (module docstring), over
    the requests that have a row, as the blocks' decoder family counts them; raise
    :class:`BlockLogError` naming the request file and row where the two disagree (a row's
    verify rounds against its blocks, or ISD forwards that cannot close its rejections)."""
    M = tally.shape.M
    at = np.searchsorted(tally.request_ids, table.request_id)
    safe = np.minimum(at, max(tally.n_requests - 1, 0))
    has = (at < tally.n_requests) & (tally.request_ids[safe] == table.request_id)
    blocks = np.where(has, tally.sums["blocks"][safe, 0], 0)
    hist = np.where(has[:, None], tally.sums["accept_len"][safe], 0)  # [n, M + 1]
    last_L = np.where(has, tally.last_accept_len[safe], M)
    _agree(
        table,
        "verify_rounds",
        blocks != table.verify_rounds,
        lambda r: (
            f"{table.verify_rounds[r]}, but the log holds {blocks[r]} blocks of "
            f"request {table.request_id[r]}"
        ),
    )
    cycle_hist = hist  # speculative: every verify round is a complete cycle
    if tally.decoder == "isd":
        rejected = hist[:, :M].sum(axis=1)
        opening = 1 + (table.output_tokens >= 2)  # the prefill, and the cold start unless n = 1
        closed = table.forwards - table.verify_rounds - opening  # cold starts after rejections
        still_open = rejected - closed  # 1: the last round rejected and the request ended there
        impossible = (still_open < 0) | (still_open > 1) | ((still_open == 1) & (last_L == M))
        _agree(
            table,
            "forwards",
            impossible,
            lambda r: (
                f"{table.forwards[r]} forwards imply {closed[r]} cold starts after "
                f"rejections, but request {table.request_id[r]} has {rejected[r]} "
                f"rejections in the log"
            ),
        )
        lengths = np.arange(M + 1)
        cycle_hist = hist - still_open[:, None] * (lengths == last_L[:, None])
    cost = cost_model(tally.decoder, M)  # g_k, c_k: a complete cycle's tokens and forwards
    per_length = cycle_hist.sum(axis=0)
    tokens = int(per_length @ np.asarray(cost.gains).astype(np.int64))
    forwards = int(per_length @ np.asarray(cost.costs).astype(np.int64))
    at_least = np.cumsum(per_length[::-1])[::-1]
    return RunTPF.from_counts(
        requests=len(table),
        output_tokens=int(table.output_tokens.sum()),
        forwards=int(table.forwards.sum()),
        cycle_tokens=tokens,
        cycle_forwards=forwards,
        cycle_profile=AcceptanceProfile(at_least[:-1].copy(), at_least[1:].copy()),
        level=level,
        seed=seed,
        draws=draws,
        decoder=tally.decoder,
    )


def _agree(table: RequestTable, column: str, bad: Any, problem: Any) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        r = int(rows[0])
        file, row = table.where(r)
        raise BlockLogError(file, column, row, problem(r))
