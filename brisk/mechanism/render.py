"""The mechanism report as text: the table of the paper's tab:mechanism_summary (adding the
pooled rate and the number of requests behind each equal-request average, and the
local-repetition statistics of app:mech_collision), the notes a reader must see, and
summary.md. ``brisk mechanism report`` prints the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from brisk.mechanism.runs import ALL_ROUNDS
from brisk.mechanism.schema import describe_decoder
from brisk.mechanism.stats import Mean, Rate
from brisk.mechanism.summary import NO_CORRECTOR, HeadColumn, MechanismSummary

__all__ = ["NO_REQUEST_TABLE", "TableRow", "markdown", "notes", "table_rows"]

NO_REQUEST_TABLE = (
    "no request table beside the blocks (requests-*.parquet): the whole-run and "
    "complete-cycle TPFs need each request's output tokens and forwards"
)


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
            f"{s.mean_accept_len:.3f}",
            "",
            f"{s.n_requests:,}",
        )
    )
    return rows


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
    lines += [
        f"Decoder: {describe_decoder(s.decoder)}.",
        "",
        f"Verification: {s.verification.describe()}.",
        "",
    ]
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
