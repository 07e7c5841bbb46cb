"""The drafter experiment's tables (``summary.md`` of ``brisk experiment drafter``): per arm
the means over seeds with 95 % Student-t intervals, the pooled per-position acceptance with
Jeffreys intervals, the paper's directions paired per seed, and the head on/off table
(:mod:`brisk.experiments.drafter` writes them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from brisk.experiments.drafter_config import DrafterExperimentConfig
from brisk.experiments.table import paired_change
from brisk.mechanism.stats import Interval
from brisk.theory import AcceptanceProfile

__all__ = ["head_table", "summary_markdown"]


def summary_markdown(cfg: DrafterExperimentConfig, evals: list[dict[str, Any]]) -> str:
    """The experiment's tables: per arm (means over seeds [95 % t interval]), the pooled
    acceptance per position, and the paper's direction for each other weighting."""
    M = cfg.train.block_size - 1
    e = cfg.eval
    law = "greedy" if e.temperature == 0 else f"T = {e.temperature}, drafts from the Top-{e.top_k}"
    lines = [
        f"# Drafter weightings on one target ({len(cfg.seeds)} seeds, block {M + 1}, {law}, "
        f"{evals[0]['problems']} held-out prompts, {cfg.train.token_budget:,} trained tokens)",
        "",
        "| weighting | TPF (tokens / target forward) | E[L] | draft cost ρ | tok/s ÷ plain AR "
        "| SD = AR | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in cfg.arms:
        rows = [ev for ev in evals if ev["arm"] == arm]
        cells = [
            Interval.of([r[k] for r in rows]).format(1.0, d)
            for k, d in (("tpf", 3), ("mean_accept", 3), ("draft_cost", 2), ("speedup", 3))
        ]
        same = _same_cell(rows)
        lines.append(f"| {arm} | {' | '.join(cells)} | {same} | {len(rows)} |")
    lines += [
        "",
        "Cells: mean over seeds [95 % Student-t interval]. tok/s: brisk's speculative loop and "
        "the target's plain AR decoding, one request at a time each, in the same process. "
        "SD = AR: outputs that are the plain AR decoding's token for token, of all decoded "
        "(every one at T = 0).",
        "",
        "Acceptance a_i per position, pooled over seeds [95 % Jeffreys interval]:",
        "",
        "| weighting | " + " | ".join(f"a_{i + 1}" for i in range(M)) + " |",
        "|---|" + "---|" * M,
    ]
    lines += _acceptance_rows(cfg.arms, evals, M)
    values = {(ev["arm"], int(ev["seed"])): float(ev["tpf"]) for ev in evals}
    lines += [
        "",
        "The paper's direction (BRISK weights train the better drafter), paired per seed: the "
        "mean log-ratio of TPF [95 % Student-t interval], as a change.",
        "",
        "| comparison | change of TPF [95 % CI] | seeds | verdict |",
        "|---|---:|---:|---|",
    ]
    for other in [a for a in cfg.arms if a != "brisk" and "brisk" in cfg.arms]:
        change = paired_change(values, "brisk", other)
        if change is None:
            continue
        cell, verdict = _change_cell(values, "brisk", other)
        lines.append(f"| brisk ÷ {other} | {cell} | {change.k} | {verdict} |")
    headed = [ev for ev in evals if "head" in ev]
    if headed:
        lines += ["", *head_table(cfg, headed)]
    return "\n".join(lines) + "\n"


def _same_cell(rows: list[dict[str, Any]]) -> str:
    """``k/n`` outputs equal to plain AR's over ``rows`` ("–" for records from before it was
    counted)."""
    if any("same_as_ar" not in r for r in rows):
        return "–"
    return f"{sum(r['same_as_ar'] for r in rows)}/{sum(r['problems'] for r in rows)}"


def _acceptance_rows(arms: tuple[str, ...], records: list[dict[str, Any]], M: int) -> list[str]:
    """One table row per arm: a_i pooled over its records' counts (``arm``, ``reached``,
    ``accepted``) with 95 % Jeffreys intervals; "–" where no block reached position i."""
    lines = []
    for arm in arms:
        rows = [r for r in records if r["arm"] == arm]
        if not rows:
            continue
        reached = np.sum([r["reached"] for r in rows], axis=0).astype(np.int64)
        accepted = np.sum([r["accepted"] for r in rows], axis=0).astype(np.int64)
        profile = AcceptanceProfile(reached, accepted)
        low, high = profile.interval()
        rates = profile.rates()
        cells = [
            f"{rates[i]:.3f} [{low[i]:.3f}, {high[i]:.3f}]" if reached[i] else "–" for i in range(M)
        ]
        lines.append(f"| {arm} | {' | '.join(cells)} |")
    return lines


def _change_cell(values: dict[tuple[str, int], float], num: str, den: str) -> tuple[str, str]:
    """A paired change as a cell, and its verdict."""
    change = paired_change(values, num, den)
    if change is None:
        return "–", "–"
    cell = f"{100 * change.mean:+.1f} %"
    if change.k > 1:
        cell += f" [{100 * change.low:+.1f}, {100 * change.high:+.1f}]"
    verdict = (
        "above zero"
        if change.k > 1 and change.low > 0
        else "below zero"
        if change.k > 1 and change.high < 0
        else "not distinguishable from zero"
    )
    return cell, verdict


def head_table(cfg: DrafterExperimentConfig, evals: list[dict[str, Any]]) -> list[str]:
    """Head off and on per arm: TPF, E[L], tok/s against plain AR (all three measured in one
    window), the head's change of TPF paired per seed, and whether head-on greedy output was
    head-off's."""
    h = evals[0]["head"].get("config", cfg.head.to_dict())  # what the stage ran with
    prompts = sorted({ev["head"].get("event_prompts", h["problems"]) for ev in evals})
    lines = [
        f"Head on and off (the corrector drafting over the drafter's Top-{h['K']}; {h['size']} "
        f"head trained on each drafter's events on {'/'.join(map(str, prompts))} training "
        "prompts):",
        "",
        "| weighting | TPF off | TPF on | change of TPF [95 % CI] | verdict | E[L] on "
        "| tok/s ÷ AR, off | tok/s ÷ AR, on | same output | seeds |",
        "|---|---|---|---:|---|---|---|---|---|---|",
    ]
    for arm in cfg.arms:
        rows = [ev["head"] for ev in evals if ev["arm"] == arm]
        if not rows:
            continue
        seeds = [int(ev["seed"]) for ev in evals if ev["arm"] == arm]
        values = {("on", s): r["tpf"] for s, r in zip(seeds, rows, strict=True)}
        values |= {("off", s): r["tpf_off"] for s, r in zip(seeds, rows, strict=True)}
        cell, verdict = _change_cell(values, "on", "off")
        means = [
            Interval.of([r[k] for r in rows]).format(1.0, d)
            for k, d in (
                ("tpf_off", 3),
                ("tpf", 3),
                ("mean_accept", 3),
                ("speedup_off", 3),
                ("speedup", 3),
            )
        ]
        same = sum(bool(r["identical_output"]) for r in rows)
        lines.append(
            f"| {arm} | {means[0]} | {means[1]} | {cell} | {verdict} | {means[2]} | {means[3]} "
            f"| {means[4]} | {same}/{len(rows)} | {len(rows)} |"
        )
    M = cfg.train.block_size - 1
    lines += [
        "",
        "Same output: head-on decoding output exactly head-off's tokens (required at T = 0, "
        "where both are the target's greedy decoding).",
        "",
        "Acceptance a_i per position with the head on, pooled over seeds [95 % Jeffreys interval]:",
        "",
        "| weighting | " + " | ".join(f"a_{i + 1}" for i in range(M)) + " |",
        "|---|" + "---|" * M,
        *_acceptance_rows(cfg.arms, [{"arm": ev["arm"], **ev["head"]} for ev in evals], M),
    ]
    on = {(ev["arm"], int(ev["seed"])): float(ev["head"]["tpf"]) for ev in evals}
    others = [a for a in cfg.arms if a != "brisk" and any(arm == a for arm, _ in on)]
    if any(arm == "brisk" for arm, _ in on) and others:
        lines += [
            "",
            "The weightings with the head on, paired per seed:",
            "",
            "| comparison | change of TPF [95 % CI] | verdict |",
            "|---|---:|---|",
        ]
        for other in others:
            cell, verdict = _change_cell(on, "brisk", other)
            lines.append(f"| brisk + head ÷ {other} + head | {cell} | {verdict} |")
    return lines
