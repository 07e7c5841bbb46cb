"""The TPFs of a decoding run: each has one name, and is computed the same way wherever it is
shown (``brisk decode``'s summary, the mechanism report's table, JSON and plots).

- **TPF, whole run** — Σ_r n_r / Σ_r F_r: output tokens (cut at EOS or the budget) over
  forwards, the prefill included (it commits the first token, as in SGLang's serving loop), so
  an autoregressive decoder has exactly 1. What a user of the decoder gets;
  :func:`brisk.theory.run_tpf` is its expectation under a profile.
- **TPF, complete cycles** — tokens over forwards of complete renewal cycles only: a verify
  round that accepts all M proposals (M + 1 tokens, 1 forward), or one that rejects at L < M
  together with the cold start that follows it (L + 2 tokens, 2 forwards). Each request's
  prefill, its opening cold start and its unfinished last cycle are left out, which is why it
  exceeds the whole-run TPF. By the renewal-reward identity it equals
  eq:idlm_tpf_instantiation at the plug-in profile of the same cycles.
- **TPF, renewal theory** — eq:idlm_tpf_instantiation at the complete cycles' acceptance
  profile, as the posterior median and credible interval of
  :meth:`brisk.theory.AcceptanceProfile.tpf_interval`: the long-run TPF the measured profile
  supports, with its uncertainty.

A decode knows all three from its own counters. A block log knows them when its directory holds
the request table (:mod:`brisk.mechanism.requests`): whole-run from the requests' output tokens
and forwards; complete cycles from the blocks' accept lengths, closing a request's rejections
with the cold starts its forwards imply (F = 1 + verify rounds + closed rejections for a
request that ends at its prefill, i.e. n = 1, else F = 2 + verify rounds + closed rejections:
the prefill and the opening cold start).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from brisk.mechanism.requests import RequestTable
from brisk.mechanism.schema import BlockLogError
from brisk.mechanism.tally import RequestTally
from brisk.theory import AcceptanceProfile, CostModel, TPFInterval

__all__ = ["ALL_ROUNDS", "COMPLETE_CYCLES", "RENEWAL", "WHOLE_RUN", "RunTPF", "run_tpf_of_log"]

WHOLE_RUN = "TPF, whole run"
COMPLETE_CYCLES = "TPF, complete cycles"
RENEWAL = "TPF, renewal theory"
ALL_ROUNDS = "TPF, renewal theory at every logged round"
"""What a log without its request table still gives: eq:idlm_tpf_instantiation at the profile of
every logged round, none of the run's TPFs above (its cold starts and prefills are unknown)."""
RENEWAL_MEANS = "ISD's renewal formula at the complete cycles' acceptance profile"


@dataclass(frozen=True)
class RunTPF:
    """The measured counts behind the three TPFs of a run (module docstring) and the renewal
    interval at the complete cycles' profile."""

    requests: int
    output_tokens: int
    forwards: int
    cycle_tokens: int
    cycle_forwards: int
    cycle_profile: AcceptanceProfile
    renewal: TPFInterval

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
    ) -> RunTPF:
        """The renewal interval is computed here, with the same draws everywhere."""
        cost = CostModel.isd(cycle_profile.M)
        renewal = cycle_profile.tpf_interval(cost, level, draws=draws, seed=seed)
        return cls(
            requests, output_tokens, forwards, cycle_tokens, cycle_forwards, cycle_profile, renewal
        )

    @property
    def whole_run(self) -> float:
        return self.output_tokens / self.forwards if self.forwards else math.nan

    @property
    def complete_cycles(self) -> float:
        return self.cycle_tokens / self.cycle_forwards if self.cycle_forwards else math.nan

    def lines(self) -> list[tuple[str, str, str, str]]:
        """(name, value, counts, what it is) for each TPF; the renewal line only when there
        are complete cycles."""
        rows = [
            (
                WHOLE_RUN,
                f"{self.whole_run:.3f}",
                f"{self.output_tokens:,} tokens ÷ {self.forwards:,} forwards",
                "output tokens ÷ forwards, the prefill (which commits the first token) included",
            ),
            (
                COMPLETE_CYCLES,
                f"{self.complete_cycles:.3f}",
                f"{self.cycle_tokens:,} tokens ÷ {self.cycle_forwards:,} forwards",
                "verify rounds and the cold starts after their rejections; each request's prefill, "
                "opening cold start and unfinished last cycle left out",
            ),
        ]
        if self.cycle_profile.n_blocks:
            t, pct = self.renewal, round(100 * self.renewal.level)
            rows.append(
                (
                    RENEWAL,
                    f"{t.estimate:.3f} [{t.low:.3f}, {t.high:.3f}]",
                    f"posterior median [{pct}% CI]",
                    RENEWAL_MEANS,
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
    the requests that have a row; raise :class:`BlockLogError` naming the request file and row
    where the two disagree (a row's verify rounds against its blocks, or forwards that cannot
    close its rejections)."""
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
    rejected = hist[:, :M].sum(axis=1)
    opening = 1 + (table.output_tokens >= 2)  # the prefill, and the cold start unless n = 1
    closed = table.forwards - table.verify_rounds - opening  # cold starts after the opening one
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
    tokens = (cycle_hist * np.where(lengths == M, M + 1, lengths + 2)).sum()
    forwards = (cycle_hist * np.where(lengths == M, 1, 2)).sum()
    at_least = np.cumsum(cycle_hist.sum(axis=0)[::-1])[::-1]
    return RunTPF.from_counts(
        requests=len(table),
        output_tokens=int(table.output_tokens.sum()),
        forwards=int(table.forwards.sum()),
        cycle_tokens=int(tokens),
        cycle_forwards=int(forwards),
        cycle_profile=AcceptanceProfile(at_least[:-1].copy(), at_least[1:].copy()),
        level=level,
        seed=seed,
        draws=draws,
    )


def _agree(table: RequestTable, column: str, bad: Any, problem: Any) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        r = int(rows[0])
        file, row = table.where(r)
        raise BlockLogError(file, column, row, problem(r))
