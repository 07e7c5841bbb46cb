"""The mechanism report: every diagnostic of a set of logs, as a table, JSON, Markdown and plots.

:func:`analyze` runs one streaming pass (:func:`~brisk.mechanism.tally.tally_blocks`) and then
computes every statistic from the per-request sums with one shared request-clustered bootstrap
(:class:`~brisk.mechanism.stats.Bootstrap`). The table follows the paper's
tab:mechanism_summary, adding the pooled rate and the number of requests behind each
equal-request average, and the local-repetition statistics (app:mech_collision). The TPFs are
those of :mod:`~brisk.mechanism.runs`, with the names ``brisk decode`` prints: whole run and
complete cycles when the log directory holds its request table, else only renewal theory at the
profile of every logged round, under a name of its own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from brisk.mechanism.coverage import CandidateCoverage, candidate_coverage
from brisk.mechanism.io import DEFAULT_BATCH_ROWS, log_files
from brisk.mechanism.likelihood import BlockLikelihood, block_likelihood
from brisk.mechanism.repetition import Repetition, repetition
from brisk.mechanism.replay import SameStateReplay, same_state_replay
from brisk.mechanism.requests import RequestTable, read_requests
from brisk.mechanism.runs import RunTPF, run_tpf_of_log
from brisk.mechanism.schema import UNKNOWN_VERIFICATION, LogShape, Verification
from brisk.mechanism.stats import Bootstrap, Mean, Rate
from brisk.mechanism.tally import RequestTally, tally_blocks
from brisk.theory import AcceptanceProfile, CostModel, TPFInterval

__all__ = [
    "NO_CORRECTOR",
    "MechanismSummary",
    "TableRow",
    "analyze",
    "default_ks",
    "summarize",
    "table_rows",
    "write_report",
]

NO_CORRECTOR = "no corrector in this log"
ALL_ROUNDS = "TPF, renewal theory at every logged round"
NO_REQUEST_TABLE = (
    "no request table beside the blocks (requests-*.parquet): the whole-run and "
    "complete-cycle TPFs need each request's output tokens and forwards"
)
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
    round, shown only without a request table: it is none of the run's TPFs.
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

    @property
    def has_corrector(self) -> bool:
        """Whether any head column holds data: a per-position choice, a head block or a block
        ``head_logp`` scored. A head-off log has none (``head_choice`` and ``head_block`` −1
        throughout)."""
        return bool(
            self.replay.head_positions or self.repetition.paired_blocks or self.likelihood.pairs
        )

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

    def as_dict(self) -> dict[str, Any]:
        lo, hi = self.profile.interval(self.level)
        return {
            "files": list(self.files),
            "M": self.shape.M,
            "K": self.shape.K,
            "blocks": self.n_blocks,
            "requests": self.n_requests,
            "corrector": self.has_corrector,
            "verification": {
                "rule": self.verification.rule,
                "draft_law": self.verification.draft_law,
                "temperature": _finite([self.verification.temperature])[0],
                "contradictions": self.replay.contradictions,
                "unchecked_blocks": self.replay.unchecked_blocks,
            },
            "tpf": (
                self.run.as_dict() | {"requests_without_row": self.unlisted_requests}
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
            "replay": self.replay.as_dict(),
            "coverage": self.coverage.as_dict(),
            "likelihood": self.likelihood.as_dict(),
            "repetition": self.repetition.as_dict(),
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
        tpf=profile.tpf_interval(CostModel.isd(tally.shape.M), level=level, seed=seed),
        verification=tally.verification,
        run=None if requests is None else run_tpf_of_log(tally, requests, level, seed),
        unlisted_requests=(
            0 if requests is None else int((~np.isin(tally.request_ids, requests.request_id)).sum())
        ),
    )


def analyze(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    ks: Sequence[int] | None = None,
    draws: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Callable[[int], None] | None = None,
) -> MechanismSummary:
    """Validate, tally and summarize logs (files or part directories) in one streaming pass;
    the request tables of the log directories, if any, give the run's TPFs."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    paths = list(paths)
    files = tuple(str(f) for f in log_files(paths))
    tally = tally_blocks(files, batch_rows=batch_rows, progress=progress)
    requests = read_requests(paths, tally.shape.M)
    return summarize(tally, ks, draws, seed, level, files, requests)


@dataclass(frozen=True)
class TableRow:
    """One line of the report table (strings, already formatted)."""

    section: str
    quantity: str
    unit: str
    value: str
    pooled: str
    requests: str


def _pct(r: Rate, scale: float = 100.0, digits: int = 2) -> tuple[str, str, str]:
    def f(x: float) -> str:
        return "—" if not math.isfinite(x) else f"{scale * x:.{digits}f}"

    interval = f" [{f(r.low)}, {f(r.high)}]" if math.isfinite(r.low) else ""
    used = f"{r.requests:,}" + (f" ({r.excluded:,} excl.)" if r.excluded else "")
    return f(r.equal_request) + interval, f(r.pooled), used


def _mean(m: Mean, signed: bool = False, digits: int = 3) -> tuple[str, str, str]:
    def f(x: float) -> str:
        return (
            "—" if not math.isfinite(x) else (f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}")
        )

    interval = f" [{f(m.low)}, {f(m.high)}]" if math.isfinite(m.low) else ""
    used = f"{m.requests:,}" + (f" ({m.excluded:,} excl.)" if m.excluded else "")
    return f(m.equal_request) + interval, f(m.pooled), used


def table_rows(s: MechanismSummary) -> list[TableRow]:
    """The report table: the rows of the paper's tab:mechanism_summary, then local repetition
    (app:mech_collision) and the acceptance profile."""
    M, rows = s.shape.M, []
    sec = "Candidate availability and same-state repair (%)"
    for k in s.ks:
        rows.append(
            TableRow(
                sec,
                f"Verifier top-1 in base-q Top-{k}",
                "First breakers",
                *_pct(s.coverage.coverage[k - 1]),
            )
        )
    for k in s.ks:
        rows.append(
            TableRow(
                sec,
                f"Verifier top-1 mass in Top-{k}",
                "First breakers, p*-weighted",
                *_pct(s.coverage.mass[k - 1]),
            )
        )
    for k in s.ks:
        rows.append(
            TableRow(
                sec,
                f"Verifier probability on base-q Top-{k}",
                "First breakers, Σ p over C",
                *_pct(s.coverage.set_mass[k - 1]),
            )
        )
    rep = s.replay

    def head(column: HeadColumn, cells: tuple[str, str, str]) -> tuple[str, str, str]:
        # a corrector row without data says why, rather than showing a row of dashes
        gap = s.head_gap(column)
        return cells if gap is None else (gap, "", "")

    rows += [
        TableRow(
            sec,
            "Corrector changes selected token",
            "First breakers",
            *head("head_choice", _pct(rep.intervention)),
        ),
        TableRow(
            sec,
            "Corrector rescues rejection",
            "Per 100 first breakers",
            *head("head_choice", _pct(rep.rescue)),
        ),
        TableRow(
            sec,
            "Corrector introduces rejection",
            "Per 100 accepted positions",
            *head("head_choice", _pct(rep.regression)),
        ),
    ]
    sec, lk = "Whole-block verifier preference", s.likelihood
    rows += [
        TableRow(
            sec,
            "Mean ΔL",
            f"Nats per {M}-token block",
            *head("head_logp", _mean(lk.mean_delta, signed=True)),
        ),
        TableRow(
            sec,
            "Refined block has higher likelihood",
            "% of paired blocks",
            *head("head_logp", _pct(lk.positive)),
        ),
        TableRow(
            sec,
            "Equal recorded likelihood",
            "% of paired blocks",
            *head("head_logp", _pct(lk.tied)),
        ),
        TableRow(
            sec,
            "Base block has higher likelihood",
            "% of paired blocks",
            *head("head_logp", _pct(lk.negative)),
        ),
    ]
    sec, r = "Local repetition (%)", s.repetition
    rows += [
        TableRow(sec, "Adjacent repeat", "Verified positions", *_pct(r.adjacent_verified)),
        TableRow(sec, "Adjacent repeat", "First breakers", *_pct(r.adjacent_first_breakers)),
        TableRow(sec, "Non-adjacent repeat", "Verified positions", *_pct(r.nonadjacent_verified)),
        TableRow(sec, "Non-adjacent repeat", "First breakers", *_pct(r.nonadjacent_first_breakers)),
        TableRow(
            sec,
            "Head rescues adjacent-repeat breaker",
            "Per 100 such breakers",
            *head("head_choice", _pct(r.adjacent_head_rescue)),
        ),
        TableRow(
            sec,
            "Head rescues non-adjacent-repeat breaker",
            "Per 100 such breakers",
            *head("head_choice", _pct(r.nonadjacent_head_rescue)),
        ),
    ]
    # base and head blocks alike count only blocks with a head block (paired blocks)
    for what, base, own in (
        ("Adjacent", r.adjacent_per_block_base, r.adjacent_per_block_head),
        ("Non-adjacent", r.nonadjacent_per_block_base, r.nonadjacent_per_block_head),
    ):
        rows += [
            TableRow(
                sec,
                f"{what} repeats, base block",
                "Tokens per block",
                *head("head_block", _mean(base)),
            ),
            TableRow(
                sec,
                f"{what} repeats, head block",
                "Tokens per block",
                *head("head_block", _mean(own)),
            ),
        ]
    sec = "Tokens per forward"
    if s.run is not None:
        requests = f"{s.run.requests:,}" + (
            f" ({s.unlisted_requests:,} without a row)" if s.unlisted_requests else ""
        )
        rows += [
            TableRow(sec, name, counts, value, "", requests)
            for name, value, counts, _ in s.run.lines()
        ]
    else:
        t = s.tpf
        rows.append(
            TableRow(
                sec,
                ALL_ROUNDS,
                f"Tokens per forward (posterior median [{round(100 * s.level)}% CI])",
                f"{t.estimate:.3f} [{t.low:.3f}, {t.high:.3f}]",
                "",
                f"{s.n_requests:,}",
            )
        )
    rows.append(
        TableRow(
            "Acceptance profile (every logged round)",
            "Accepted-prefix length E[L]",
            "Tokens per block",
            f"{_mean_accept_len(s.profile):.3f}",
            "",
            f"{s.n_requests:,}",
        )
    )
    return rows


def _mean_accept_len(profile: AcceptanceProfile) -> float:
    """E[L] = Σ_i accepted_i / blocks (each accepted position adds one to L)."""
    return float(profile.accepted.sum() / profile.n_blocks) if profile.n_blocks else math.nan


def notes(s: MechanismSummary) -> list[str]:
    """What a reader of the numbers must know: a log that contradicts its own verification, a
    check that could not run, TPFs that could not be computed. Empty for a consistent log."""
    out = []
    n = s.replay.contradictions
    if n and s.verification.rule == "unknown":
        out.append(
            f"the log does not record how it was verified, and at {n:,} reached positions the "
            "paper's same-state rule on the base token contradicts accept_len (verified "
            "greedily, or with another draft law?): rescue and regression follow the paper's rule"
        )
    elif n:
        out.append(
            f"at {n:,} reached positions the log's own verification rule "
            f"({s.verification.describe()}) contradicts accept_len: these blocks were not "
            "verified as the log says"
        )
    if s.replay.unchecked_blocks:
        out.append(
            f"accept_len of {s.replay.unchecked_blocks:,} blocks was not checked: they were "
            "drafted from the corrector's softmax, which the log does not hold"
        )
    if s.run is None:
        out.append(NO_REQUEST_TABLE)
    elif s.unlisted_requests:
        out.append(
            f"{s.unlisted_requests:,} requests have blocks but no row in the request table "
            "(unfinished when the log closed): the TPFs leave them out"
        )
    return out


def markdown(s: MechanismSummary, plots: Sequence[str] = ()) -> str:
    """summary.md: what was read, the table, and the plots."""
    pct = round(100 * s.level)
    lines = [
        "# Mechanism report",
        "",
        f"{s.n_blocks:,} blocks from {s.n_requests:,} requests (M = {s.shape.M}, "
        f"K = {s.shape.K}) in {len(s.files)} file(s). Equal-request averages with "
        f"{pct}% request-clustered bootstrap intervals ({s.draws} draws, seed {s.seed}); "
        "pooled rates beside them; requests with a zero denominator are excluded from a "
        "rate's mean and counted as excl.",
        "",
    ]
    if not s.has_corrector:
        lines += [
            f"**Note:** {NO_CORRECTOR} (head_choice and head_block are −1 throughout and no "
            "block has head_logp): the corrector's rows and plot panels say so instead of "
            "showing values.",
            "",
        ]
    lines += [f"Verification: {s.verification.describe()}.", ""]
    for note in notes(s):
        lines += [f"**Note:** {note}", ""]
    section = None
    for row in table_rows(s):
        if row.section != section:
            if section is not None:
                lines.append("")
            section = row.section
            lines += [
                f"## {section}",
                "",
                f"| Quantity | Population / unit | Equal-request [{pct}% CI] | Pooled | Requests |",
                "|---|---|---|---|---|",
            ]
        lines.append(
            f"| {row.quantity} | {row.unit} | {row.value} | {row.pooled} | {row.requests} |"
        )
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(s: MechanismSummary, out: str | os.PathLike[str]) -> list[Path]:
    """Write summary.json, summary.md and the PNG plots into ``out``; return the paths."""
    from brisk.mechanism.plots import save_plots

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = save_plots(s, out_dir)
    (out_dir / "summary.json").write_text(json.dumps(s.as_dict(), indent=1, allow_nan=False))
    (out_dir / "summary.md").write_text(markdown(s, [str(p) for p in pngs]))
    return [out_dir / "summary.json", out_dir / "summary.md", *pngs]
