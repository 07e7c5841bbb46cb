"""The corrector ablation and the head-on/head-off measurement, one command
(``brisk experiment corrector --config FILE``).

Steps, each skipped when its output already exists (so a rerun resumes):

1. the frozen backbone (trained from ``base_config`` if ``backbone`` does not exist yet);
2. one event store of that backbone on training problems (``brisk train corrector collect``,
   Top-``collect.top_k`` candidates so every arm's K is a prefix of it);
3. every arm × seed (:data:`ARMS`) trained on the same events and evaluated on the same
   held-out problems with the same decode seeds at stride N, temperature T, head on:
   accuracy, rejection %, E[L], TPF, tokens/s with and without the head's own time; then the
   same problems decoded in shadow mode (head beside the base, both blocks scored) for the
   same-state diagnostics: rescue per 100 first breakers, regression per 100 accepted
   positions, intervention, coverage@K', ΔL. The head-off arm is evaluated with the same seeds;
4. the table across seeds (markdown, JSON), plots (TPF, rescue vs regression, validation loss)
   and ``brisk mechanism report`` on the shadow logs of the paper's head (first seed).

Jobs run ``workers`` at a time in separate processes with one torch thread each. SIGINT or
SIGTERM stops the step under way at its next safe point (a training run with a checkpoint, the
collection after its last whole batch, an evaluation at once) and ends the command with one line
saying what stays; rerunning it continues (:mod:`brisk.experiments.common`). Outputs under
``out_dir``: ``events/``, ``arms/<arm>/seed<s>/`` (head checkpoint, metrics, ``train.json``,
``eval.json``, ``shadow/``), ``summary.md``, ``summary.json``, ``arms.png``, ``rescue.png``,
``val_loss.png``, ``mechanism/``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import StopSignals, stop_signals
from brisk.experiments.common import (
    ExperimentRun,
    begin_experiment,
    job_dir,
    read_eval,
    run_jobs,
)
from brisk.experiments.corrector_config import (
    ARMS,
    PAPER_ARM,
    CorrectorArm,
    CorrectorExperimentConfig,
    arm_named,
)
from brisk.experiments.heads import collect_once, train_head
from brisk.mechanism.stats import Interval

__all__ = ["ARMS", "CorrectorArm", "CorrectorExperimentConfig", "run_corrector_experiment"]


def _mechanism(blocks: Path, K: int) -> dict[str, float]:
    """Same-state diagnostics of one shadow log (equal-request rates, as fractions)."""
    from brisk.mechanism.report import analyze

    s = analyze(blocks, draws=0)
    cov = s.coverage.at(K)
    return {
        "rescue": s.replay.rescue.equal_request,
        "regression": s.replay.regression.equal_request,
        "intervention": s.replay.intervention.equal_request,
        "first_breakers": float(s.replay.first_breakers),
        "coverage": cov["coverage"],
        "mass": cov["mass"],
        "delta_logp": s.likelihood.mean_delta.equal_request,
        "delta_positive": s.likelihood.positive.equal_request,
    }


def _job(cfg: CorrectorExperimentConfig, events: str, arm_name: str, seed: int) -> dict[str, Any]:
    """Train (unless head off), evaluate head-on and in shadow mode; returns both. A signal
    stops the training at its next step (with a checkpoint) and the evaluations at once."""
    with stop_signals() as stop:  # in a worker, its flag for life
        return _train_and_evaluate(cfg, events, arm_name, seed, stop)


def _train_and_evaluate(
    cfg: CorrectorExperimentConfig, events: str, arm_name: str, seed: int, stop: StopSignals
) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    arm = arm_named(arm_name)
    run, done = job_dir(cfg.out_dir, arm.name, seed)
    if done is not None:
        return done
    tcfg = cfg.train.replace(
        events=events, out_dir=str(run), seed=seed, device=cfg.device, dtype=cfg.dtype
    ).replace(**arm.train)
    head = None
    train_info: dict[str, Any] = {}
    if arm.trained:
        head, train_info = train_head(tcfg)
    held_out = cfg.held_out
    problems = held_out.problems()
    # head off drafts from the Top-16 of q (ISDOptions.top_k), the paper's K
    with stop.abortable():  # rerun whole: only eval.json marks the job done
        ev = held_out.evaluate(cfg.backbone, problems, arm.name, seed, corrector=head)
        result: dict[str, Any] = {"eval": ev.to_dict(), "train": train_info}
        if head is not None and cfg.eval.shadow:
            shadow = run / "shadow"
            shutil.rmtree(shadow, ignore_errors=True)
            held_out.evaluate(
                cfg.backbone,
                problems,
                arm.name,
                seed,
                corrector=head,
                log_blocks=shadow,
                shadow=True,
            )
            result["mechanism"] = _mechanism(shadow, head.config.K)
    atomic_write_text(run / "eval.json", json.dumps(result, indent=2))
    return dict(json.loads(json.dumps(result)))  # as a resumed run reads it back


# the shadow-mode diagnostics: (key, header, scale, digits), as brisk.experiments.table.COLUMNS
MECH_COLUMNS = (
    ("rescue", "Rescue / 100 first breakers", 100, 2),
    ("regression", "Regression / 100 accepted", 100, 2),
    ("intervention", "Intervention at first breakers (%)", 100, 1),
    ("coverage", "Coverage@K (%)", 100, 2),
    ("mass", "Mass@K (%)", 100, 2),
    ("delta_logp", "ΔL (nats / block)", 1, 3),
)
MECH = tuple(key for key, _, _, _ in MECH_COLUMNS)


def run_corrector_experiment(
    cfg: CorrectorExperimentConfig, show_progress: bool = True
) -> dict[str, Any]:
    """Run (or resume) the ablation; returns the summary that ``summary.json`` holds. SIGINT or
    SIGTERM ends it with :class:`~brisk._interrupt.Interrupted` (module docstring)."""
    with begin_experiment(cfg, show_progress) as run:
        return _run(cfg, run)


def _run(cfg: CorrectorExperimentConfig, run: ExperimentRun) -> dict[str, Any]:
    import torch

    # 1. The frozen backbone.
    run.ensure_checkpoint(cfg.backbone, cfg.base_config, "training the backbone")

    # 2. One event store for every arm.
    events = run.out / "events"
    if not (events / "_events.json").exists():
        run.console.print(f"collecting policy-reached events → {events}")
        with run.step("collecting events", timing="collect_s"):
            torch.set_num_threads(max(1, min(cfg.workers, os.cpu_count() or 1)))
            store = cfg.decode_problems(
                collect_once, cfg.backbone, events, cfg.collect, run.show_progress
            )
        if store is not None:
            run.console.print(
                f"{len(store)} events, {store.correct.mean():.1%} from correct responses"
            )

    # 3. Arms × seeds in worker processes.
    jobs = [(a, seed) for a in cfg.arms for seed in cfg.seeds]

    def done(count: int, a: str, seed: int, res: dict[str, Any]) -> None:
        run.eval_done(count, len(jobs), a, seed, res["eval"])

    with run.step(f"running the arm × seed jobs in {run.out / 'arms'}", timing="arms_s"):
        results = run_jobs(cfg.workers, _job, jobs, (cfg, str(events)), done)

    # 4. Table, plots, the mechanism report of the paper's head (abortable: a rerun writes them
    # again from the jobs' results).
    with run.summarizing():
        return _summarize(cfg, results, run)


def _summarize(
    cfg: CorrectorExperimentConfig,
    results: dict[tuple[str, int], dict[str, Any]],
    run: ExperimentRun,
) -> dict[str, Any]:
    from brisk.experiments.evaluate import summarize

    out = run.out
    ordered = [read_eval(results[(a, s)]["eval"]) for a in cfg.arms for s in cfg.seeds]
    metrics = (
        "accuracy",
        "rejection",
        "accept_length",
        "tpf_run",
        "tpf_cycles",
        "tokens_per_s",
        "tokens_per_s_net",
        "head_s",
    )
    summaries = {sm.arm: sm for sm in summarize(ordered, metrics=metrics)}
    mech: dict[str, dict[str, Interval]] = {}
    for a in cfg.arms:
        rows = [results[(a, s)].get("mechanism") for s in cfg.seeds]
        if all(r is not None for r in rows):
            mech[a] = {m: Interval.of([r[m] for r in rows if r is not None]) for m in MECH}
    table = _markdown(cfg, summaries, mech)
    _plots(cfg, summaries, mech, out)
    if PAPER_ARM in cfg.arms and cfg.eval.shadow:
        from brisk.mechanism.report import analyze, write_report

        shadow = out / "arms" / PAPER_ARM / f"seed{cfg.seeds[0]}" / "shadow"
        write_report(analyze(shadow, draws=200), out / "mechanism")  # brisk mechanism report
    run.timings["total_s"] = time.monotonic() - run.t0
    summary = {
        "config": cfg.to_dict(),
        "arms": [summaries[a].to_dict() for a in cfg.arms],
        "mechanism": {a: {m: dataclasses.asdict(v) for m, v in d.items()} for a, d in mech.items()},
        "runs": [{"arm": a, "seed": s, **results[(a, s)]} for a in cfg.arms for s in cfg.seeds],
        "timings": run.timings,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(table)
    run.console.print(table, markup=False)
    return summary


def _markdown(
    cfg: CorrectorExperimentConfig, summaries: dict[str, Any], mech: dict[str, Any]
) -> str:
    """Two tables: decoding (head on) and the same-state diagnostics (shadow mode)."""
    from brisk.experiments.table import COLUMNS

    off = summaries["off"].metrics["tpf_run"].mean if "off" in summaries else math.nan
    head = [
        "Head",
        "Acc. (%)",
        "Reject (%)",
        "E[L]",
        "TPF, whole run",
        "TPF, cycles",
        "tok/s (CPU)",
        "tok/s without head time",
        "head share of time (%)",
        "ΔTPF vs off",
    ]
    lines = [
        f"# Corrector ablation ({len(cfg.seeds)} seeds, N = {cfg.stride}, "
        f"T = {cfg.eval.temperature}, {cfg.eval.problems} held-out problems, same backbone and "
        "events for every head)\n",
        *_header(head),
    ]
    for a in cfg.arms:
        m = summaries[a].metrics
        net = m["tokens_per_s_net"].format(1.0, 0) if arm_named(a).trained else "–"
        share_iv = _share(m)
        cells = [
            arm_named(a).label,
            *_cells(m, COLUMNS),  # the arms' table's interval columns
            net,
            share_iv if arm_named(a).trained else "–",
            f"{100 * (m['tpf_run'].mean / off - 1):+.1f} %" if a != "off" else "",
        ]
        lines.append(_row(cells))
    lines.append(
        "\nCells: mean over seeds [95 % Student-t interval]. tok/s: one CPU thread per run, two "
        "runs at a time on a 2-core machine; 'without head time' removes the head's own "
        "selection time from the wall clock.\n"
    )
    if mech:
        lines += [
            "## Same-state diagnostics (shadow mode: head beside the base, same draws)\n",
            *_header(["Head", *(h for _, h, _, _ in MECH_COLUMNS)]),
        ]
        for a, d in mech.items():
            lines.append(_row([arm_named(a).label, *_cells(d, MECH_COLUMNS)]))
        lines.append(
            "\nEqual-request rates of each seed's shadow log, then mean [t-interval] across "
            "seeds. Coverage / mass at the head's own K, at head-off first breakers.\n"
        )
    return "\n".join(lines)


def _header(head: list[str]) -> list[str]:
    """A markdown table's header row and rule (the first column left-aligned, the rest right)."""
    return [_row(head), "|---|" + "---:|" * (len(head) - 1)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cells(
    intervals: dict[str, Any], columns: tuple[tuple[str, str, float, int], ...]
) -> list[str]:
    """The cells of ``columns`` ((key, header, scale, digits)) from ``intervals``."""
    return [intervals[key].format(scale, digits) for key, _, scale, digits in columns]


def _share(m: dict[str, Any]) -> str:
    """The head's share of decoding wall time, from tok/s with and without it (seed means)."""
    gross, net = m["tokens_per_s"].mean, m["tokens_per_s_net"].mean
    if not (gross > 0 and net > 0):
        return "–"
    return f"{100 * (1 - gross / net):.1f}"


def _plots(
    cfg: CorrectorExperimentConfig, summaries: dict[str, Any], mech: dict[str, Any], out: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from brisk.experiments.table import plot_summaries
    from brisk.runtime.train.plots import save_figure

    plot_summaries([summaries[a] for a in cfg.arms], out / "arms.png")
    if mech:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        names = list(mech)
        x = range(len(names))
        for offset, key, label in (
            (-0.2, "rescue", "rescue / 100 first breakers"),
            (0.2, "regression", "regression / 100 accepted"),
        ):
            means = [100 * mech[a][key].mean for a in names]
            err = [
                [100 * (mech[a][key].mean - mech[a][key].low) for a in names],
                [100 * (mech[a][key].high - mech[a][key].mean) for a in names],
            ]
            err = [[0 if math.isnan(v) else v for v in row] for row in err]
            ax.bar([i + offset for i in x], means, 0.4, yerr=err, label=label, capsize=3)
        ax.set_xticks(list(x), names, rotation=20)
        ax.set_ylabel("per 100")
        ax.legend(frameon=False)
        ax.set_title("Same-state rescue vs regression (mean over seeds, 95 % t-interval)")
        save_figure(fig, out / "rescue.png")
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for a in cfg.arms:
        metrics = out / "arms" / a / f"seed{cfg.seeds[0]}" / "metrics.jsonl"
        if not metrics.exists():
            continue
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
        if val:
            ax.plot(*zip(*val, strict=True), marker="o", ms=3, label=a)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss (eq. 6, own target)")
    ax.set_title(f"Validation loss, seed {cfg.seeds[0]}")
    ax.legend(frameon=False, fontsize=8)
    save_figure(fig, out / "val_loss.png")
