"""The speed report users know from Spec-Bench: per prompt category, the speed-up over plain
decoding, the mean tokens each verify commits, and whether every output equals plain decoding's.

Its input is answer files, one JSON row per request and sample, as ``brisk decode`` writes them
(ISD, a drafter, or ``--plain``: plain autoregressive decoding, the baseline) and as ``brisk
bench requests`` writes them from a server: ``id`` and ``sample`` (which request), ``output_ids``,
``tokens``, ``forwards`` (the target's forwards, the prefill included), ``wall_s`` (the
request's own wall time: it was decoded alone) and, where the prompts file gave one,
``category``. Spec-Bench's ``speed.py`` and ``equal.py`` compute the same three numbers:

- **speed-up**: the mean over a category's requests of tokens ÷ wall time, divided by the
  baseline's mean over the same requests (Spec-Bench's ratio of means), with a paired bootstrap
  interval over the requests (the same resampled requests in both means);
- **τ, tokens per verify**: committed tokens ÷ target forwards over the category, the paper's
  TPF. For speculative decoding it is 1 + E[L] (each verify commits the accepted drafts and the
  target's own token; the prefill and a last round cut by the budget move it slightly); for ISD,
  whose cycle spends two forwards, it is the tokens-per-forward of eq. ``eq:idlm_tpf``; plain
  decoding's is 1;
- **equal**: how many outputs are the baseline's token for token (greedy decoding must give all).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from brisk._json import parse_json_object

__all__ = [
    "SpeedRow",
    "category_rows",
    "markdown",
    "read_answers",
    "speed_report",
]

REQUIRED = ("id", "output_ids", "tokens", "forwards", "wall_s")
ALL = "all"


@dataclass(frozen=True)
class Answer:
    """One request's answer as the report reads it."""

    key: tuple[str, int]  # (id, sample)
    category: str
    output_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...] | None  # what the model saw, where the file says
    tokens: int
    forwards: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def read_answers(path: str | Path, where: str) -> dict[tuple[str, int], Answer]:
    """The answers of one file, keyed by (id, sample); a missing file, a row that is not JSON
    or lacks a field (``wall_s``: the file was not decoded one request at a time) and a
    repeated key are one ``ValueError`` naming ``where``, the file and the line."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{where}: {file} is not a file")
    answers: dict[tuple[str, int], Answer] = {}
    for n, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        at = f"{where}: {file} line {n}"
        row = parse_json_object(line, at)
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            hint = (
                " (decode one request at a time, --batch-size 1, for per-request times)"
                if "wall_s" in missing
                else ""
            )
            raise ValueError(f"{at}: no {', '.join(missing)}{hint}")
        try:
            answer = Answer(
                key=(str(row["id"]), int(row.get("sample", 0))),
                category=str(row.get("category") or ALL),
                output_ids=tuple(int(t) for t in row["output_ids"]),
                prompt_ids=(
                    tuple(int(t) for t in row["prompt_ids"]) if "prompt_ids" in row else None
                ),
                tokens=int(row["tokens"]),
                forwards=int(row["forwards"]),
                wall_s=float(row["wall_s"]),
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"{at}: {err}") from None
        if answer.wall_s <= 0 or not math.isfinite(answer.wall_s):
            raise ValueError(f"{at}: wall_s must be a positive time, got {answer.wall_s}")
        if answer.key in answers:
            raise ValueError(f"{at}: request {answer.key[0]} sample {answer.key[1]} again")
        answers[answer.key] = answer
    if not answers:
        raise ValueError(f"{where}: {file} holds no answers")
    return answers


@dataclass(frozen=True)
class SpeedRow:
    """One (method, category) line of the report."""

    method: str
    category: str
    requests: int
    tokens_per_s: float  # mean over requests of tokens ÷ wall time
    baseline_tokens_per_s: float
    speedup: float
    speedup_low: float  # paired bootstrap interval over the requests
    speedup_high: float
    tau: float  # tokens ÷ target forwards
    equal: int  # outputs equal to the baseline's, token for token

    def to_json(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in vars(self).items()
        }


def _bootstrap(ours: np.ndarray, base: np.ndarray, level: float, seed: int) -> tuple[float, float]:
    """Percentile interval of mean(ours) ÷ mean(base) over requests resampled in pairs."""
    if len(ours) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(ours), size=(2000, len(ours)))
    ratios = ours[picks].mean(axis=1) / base[picks].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def category_rows(
    method: str,
    answers: dict[tuple[str, int], Answer],
    baseline: dict[tuple[str, int], Answer],
    *,
    where: str = "--run",
    level: float = 0.95,
    seed: int = 0,
) -> list[SpeedRow]:
    """The report's rows of one method against the baseline: one per category (sorted), then
    ``all``. Both files must hold the same requests (a ``ValueError`` naming ``where`` and the
    first request one of them lacks, or whose prompt ids differ)."""
    only = sorted(set(answers) ^ set(baseline))
    if only:
        side = "the baseline" if only[0] in answers else where
        raise ValueError(
            f"{where}: request {only[0][0]} sample {only[0][1]} is not in {side} "
            f"({len(only)} requests differ): compare answers to the same prompts"
        )
    for key, answer in sorted(answers.items()):
        base_ids = baseline[key].prompt_ids
        if None not in (answer.prompt_ids, base_ids) and answer.prompt_ids != base_ids:
            raise ValueError(
                f"{where}: request {key[0]} sample {key[1]} has another prompt than the "
                "baseline's (prompt_ids differ): compare answers to the same prompts"
            )
    groups: dict[str, list[tuple[str, int]]] = {}
    for key, answer in sorted(answers.items()):
        groups.setdefault(answer.category, []).append(key)
    groups = dict(sorted(groups.items()))
    if len(groups) > 1:
        groups[ALL] = sorted(answers)
    rows = []
    for category, keys in groups.items():
        ours = np.array([answers[k].tokens_per_s for k in keys])
        base = np.array([baseline[k].tokens_per_s for k in keys])
        low, high = _bootstrap(ours, base, level, seed)
        tokens = sum(answers[k].tokens for k in keys)
        forwards = sum(answers[k].forwards for k in keys)
        rows.append(
            SpeedRow(
                method=method,
                category=category,
                requests=len(keys),
                tokens_per_s=float(ours.mean()),
                baseline_tokens_per_s=float(base.mean()),
                speedup=float(ours.mean() / base.mean()),
                speedup_low=low,
                speedup_high=high,
                tau=tokens / forwards if forwards else math.nan,
                equal=sum(answers[k].output_ids == baseline[k].output_ids for k in keys),
            )
        )
    return rows


def speed_report(
    baseline: str | Path, runs: Sequence[tuple[str, str | Path]], *, seed: int = 0
) -> list[SpeedRow]:
    """Every run's rows against the baseline file (:func:`category_rows`); ``runs`` are
    (name, file) pairs."""
    base = read_answers(baseline, "--baseline")
    rows: list[SpeedRow] = []
    for name, path in runs:
        rows += category_rows(name, read_answers(path, "--run"), base, seed=seed)
    return rows


def markdown(rows: Iterable[SpeedRow]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| method | category | requests | tok/s | plain tok/s | speed-up [95 % CI] "
        "| τ (tokens / verify) | equal to plain |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        interval = (
            "" if math.isnan(r.speedup_low) else f" [{r.speedup_low:.2f}, {r.speedup_high:.2f}]"
        )
        lines.append(
            f"| {r.method} | {r.category} | {r.requests} | {r.tokens_per_s:.1f} "
            f"| {r.baseline_tokens_per_s:.1f} | {r.speedup:.2f}×{interval} | {r.tau:.2f} "
            f"| {r.equal}/{r.requests} |"
        )
    return "\n".join(lines) + "\n"
