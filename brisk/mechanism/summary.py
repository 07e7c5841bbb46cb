"""The numbers of the mechanism report: every diagnostic of a tally, in one object.

:func:`summarize` computes every statistic from the per-request sums of
:func:`~brisk.mechanism.tally.tally_blocks` with one shared request-clustered bootstrap
(:class:`~brisk.mechanism.stats.Bootstrap`). The TPFs are those of :mod:`~brisk.mechanism.runs`:
whole run and complete cycles when the log directory holds its request table, else only
renewal theory at the profile of every logged round, under a name of its own
(:data:`~brisk.mechanism.runs.ALL_ROUNDS`). :mod:`~brisk.mechanism.render` turns the summary into
tables and Markdown, :mod:`~brisk.mechanism.plots` into figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from brisk.mechanism.coverage import CandidateCoverage, candidate_coverage
from brisk.mechanism.likelihood import BlockLikelihood, block_likelihood
from brisk.mechanism.repetition import Repetition, repetition
from brisk.mechanism.replay import SameStateReplay, same_state_replay
from brisk.mechanism.requests import RequestTable
from brisk.mechanism.runs import RunTPF, cost_model, run_tpf_of_log
from brisk.mechanism.schema import UNKNOWN_VERIFICATION, Decoder, LogShape, Verification
from brisk.mechanism.stats import Bootstrap
from brisk.mechanism.tally import RequestTally
from brisk.theory import AcceptanceProfile, TPFInterval

__all__ = ["NO_CORRECTOR", "HeadColumn", "MechanismSummary", "default_ks", "summarize"]

NO_CORRECTOR = "no corrector in this log"
HeadColumn = Literal["head_choice", "head_block", "head_logp"]
_HEAD_GAPS: dict[str, str] = {
    "head_choice": "no per-position head choices (head_choice = −1 throughout)",
    "head_block": "no head blocks (head_block = −1 throughout)",
    "head_logp": "no block scored by both base_logp and head_logp",
}


@dataclass(frozen=True)
class MechanismSummary:
    """Everything the report shows. ``ks`` are the K' values singled out in the table.

    ``run`` holds the run's TPFs when the log has its request table (None otherwise), over
    the requests with a row; ``unlisted_requests`` counts requests with blocks but no row
    (unfinished when the log closed). ``tpf`` is renewal theory at the profile of every logged
    round, shown only without a request table: it is none of the run's TPFs. ``decoder`` is the
    family that wrote the log, whose cost model both renewal estimates use.
    """

    files: tuple[str, ...]
    shape: LogShape
    n_blocks: int
    n_requests: int
    ks: tuple[int, ...]
    draws: int
    seed: int
    level: float
    replay: SameStateReplay
    coverage: CandidateCoverage
    likelihood: BlockLikelihood
    repetition: Repetition
    profile: AcceptanceProfile
    tpf: TPFInterval
    verification: Verification = UNKNOWN_VERIFICATION
    run: RunTPF | None = None
    unlisted_requests: int = 0
    decoder: Decoder = "isd"

    @property
    def has_corrector(self) -> bool:
        """Whether any head column holds data: a per-position choice, a head block or a block
        ``head_logp`` scored. A head-off log has none (``head_choice`` and ``head_block`` −1
        throughout)."""
        return bool(
            self.replay.head_positions or self.repetition.paired_blocks or self.likelihood.pairs
        )

    @property
    def mean_accept_len(self) -> float:
        """E[L] = Σ_i accepted_i / blocks (each accepted position adds one to L)."""
        p = self.profile
        return float(p.accepted.sum() / p.n_blocks) if p.n_blocks else math.nan

    def head_gap(self, column: HeadColumn) -> str | None:
        """Why the corrector statistics that read ``column`` have no data, or ``None`` if they
        have some: ``head_choice`` feeds the same-state replay and head rescue among repeat
        breakers, ``head_block`` the repeats per block, ``head_logp`` ΔL. A log without any
        corrector data gives :data:`NO_CORRECTOR` for all three."""
        have = {
            "head_choice": self.replay.head_positions,
            "head_block": self.repetition.paired_blocks,
            "head_logp": self.likelihood.pairs,
        }[column]
        if have:
            return None
        return _HEAD_GAPS[column] if self.has_corrector else NO_CORRECTOR

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.profile.interval(self.level)
        return {
            "files": list(self.files),
            "M": self.shape.M,
            "K": self.shape.K,
            "blocks": self.n_blocks,
            "requests": self.n_requests,
            "corrector": self.has_corrector,
            "decoder": self.decoder,
            "verification": {
                "rule": self.verification.rule,
                "draft_law": self.verification.draft_law,
                "temperature": _finite([self.verification.temperature])[0],
                "contradictions": self.replay.contradictions,
                "unchecked_blocks": self.replay.unchecked_blocks,
            },
            "tpf": (
                self.run.to_dict() | {"requests_without_row": self.unlisted_requests}
                if self.run is not None
                else {
                    "renewal_all_rounds": {
                        "median": _finite([self.tpf.estimate])[0],
                        "low": self.tpf.low,
                        "high": self.tpf.high,
                        "level": self.tpf.level,
                    }
                }
            ),
            "bootstrap": {"draws": self.draws, "seed": self.seed, "level": self.level},
            "ks": list(self.ks),
            "replay": self.replay.to_dict(),
            "coverage": self.coverage.to_dict(),
            "likelihood": self.likelihood.to_dict(),
            "repetition": self.repetition.to_dict(),
            "acceptance_profile": {
                "reached": self.profile.reached.tolist(),
                "accepted": self.profile.accepted.tolist(),
                "rates": _finite(self.profile.rates().tolist()),
                "low": lo.tolist(),
                "high": hi.tolist(),
            },
        }


def _finite(xs: list[float]) -> list[float | None]:
    return [x if math.isfinite(x) else None for x in xs]


def default_ks(K: int) -> tuple[int, ...]:
    """The K' values a report singles out by default: those of 4, 8, 16 below K, and K.

    >>> default_ks(16), default_ks(3), default_ks(32)
    ((4, 8, 16), (3,), (4, 8, 16, 32))
    """
    return tuple(sorted({k for k in (4, 8, 16) if k < K} | {K}))


def summarize(
    tally: RequestTally,
    ks: Sequence[int] | None = None,
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    files: Sequence[str] = (),
    requests: RequestTable | None = None,
) -> MechanismSummary:
    """All statistics of a tally; ``ks`` must lie in 1..K (default: :func:`default_ks`).
    ``requests``: the log's request table, for the run's TPFs."""
    K = tally.shape.K
    ks = default_ks(K) if ks is None else ks
    bad = [k for k in ks if not 1 <= k <= K]
    if bad or not ks:
        raise ValueError(f"ks: need values in 1..K = {K}, got {list(ks)}")
    boot = Bootstrap(tally.request_ids, draws=draws, seed=seed, level=level)
    sums = dict(tally.sums)
    profile = tally.profile()
    return MechanismSummary(
        files=tuple(files),
        shape=tally.shape,
        n_blocks=tally.n_blocks,
        n_requests=tally.n_requests,
        ks=tuple(sorted(set(ks))),
        draws=draws,
        seed=seed,
        level=level,
        replay=same_state_replay(sums, boot),
        coverage=candidate_coverage(sums, boot),
        likelihood=block_likelihood(sums, boot),
        repetition=repetition(sums, boot),
        profile=profile,
        tpf=profile.tpf_interval(cost_model(tally.decoder, tally.shape.M), level=level, seed=seed),
        verification=tally.verification,
        run=None if requests is None else run_tpf_of_log(tally, requests, level, seed),
        unlisted_requests=(
            0 if requests is None else int((~np.isin(tally.request_ids, requests.request_id)).sum())
        ),
        decoder=tally.decoder,
    )
