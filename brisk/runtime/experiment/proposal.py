"""The proposal-training ablation, one command (``brisk experiment proposal --config FILE``).

Steps, each skipped when its output already exists (so a rerun resumes):

1. the base checkpoint (trained from ``base_config`` if ``base`` does not exist yet);
2. the self-generated dataset of the base (``brisk train selfgen``);
3. every trained arm × seed: ``brisk train proposal`` from the same base, with the same token
   budget and schedule (:data:`ARMS`), then an evaluation on held-out problems at stride N and
   temperature T (accuracy, rejection %, E[L], whole-run and complete-cycle TPF, tokens/s, with
   every verify round logged); the base arm is evaluated with the same decode seeds;
4. the table across seeds (markdown shaped like tab:ablation_breakdown, JSON, a plot), the
   weight-evolution figure of the BRISK arm, and ``brisk mechanism report`` on the logs of the
   arm with the highest whole-run TPF.

Jobs run ``workers`` at a time in separate processes with one torch thread each (the arms are
independent; nothing distributed). SIGINT or SIGTERM stops the step under way at its next safe
point (a training run with a checkpoint, the data after its last whole part, an evaluation at
once) and ends the command with one line saying what stays; rerunning it continues
(:mod:`brisk.runtime.experiment.common`). Outputs under ``out_dir``: ``data/``,
``arms/<arm>/seed<s>/`` (checkpoint, metrics, ``eval.json``, ``blocks/``), ``summary.md``,
``summary.json``, ``arms.png``, ``weights_<arm>.png``, ``mechanism/``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import StopSignals, stop_signals
from brisk.runtime.configs import Config
from brisk.runtime.experiment.common import (
    check_plan,
    ensure_checkpoint,
    experiment_step,
    held_out_problems,
    job_dir,
    run_jobs,
)
from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.train.proposal_config import ProposalTrainConfig
from brisk.runtime.train.selfgen import SelfGenOptions

__all__ = ["ARMS", "Arm", "ExperimentConfig", "run_experiment"]


@dataclass(frozen=True)
class Arm:
    name: str
    data: str  # "base" for the untrained base
    weights: str
    profile: str
    labels: tuple[str, str]  # (training data, W.) columns of the table


ARMS: tuple[Arm, ...] = (
    Arm("base", "base", "-", "-", ("Base (no continued training)", "–")),
    Arm("reference-dynamic", "reference", "brisk", "dynamic", ("Open-source (reference)", "D")),
    Arm("selfgen-all-dynamic", "selfgen-all", "brisk", "dynamic", ("Self-gen. (all)", "D")),
    Arm("selfgen-correct-uniform", "selfgen-correct", "uniform", "dynamic",
        ("Self-gen. (corr.)", "U")),
    Arm("selfgen-correct-dynamic", "selfgen-correct", "brisk", "dynamic",
        ("Self-gen. (corr.)", "D")),
    Arm("selfgen-correct-static", "selfgen-correct", "brisk", "static",
        ("Self-gen. (corr.)", "S")),
    Arm("selfgen-correct-dpace", "selfgen-correct", "dpace", "dynamic",
        ("Self-gen. (corr.)", "D-PACE")),
    Arm("selfgen-correct-decay", "selfgen-correct", "decay", "dynamic",
        ("Self-gen. (corr.)", "decay")),
)  # fmt: skip
BRISK_ARM = "selfgen-correct-dynamic"


@dataclass(frozen=True)
class EvalSection:
    task: TaskSpec = field(default_factory=TaskSpec)  # empty: the base's world, test split
    problems: int = 200
    temperature: float = 1.0
    max_new_tokens: int = 160
    problem_seed: int = 1
    batch_size: int = 100


@dataclass(frozen=True)
class ExperimentConfig(Config):
    out_dir: str = "runs/paper/ablation"
    base: str = "runs/paper/base/final"
    base_config: str = "configs/paper_base.toml"
    stride: int = 8
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = tuple(a.name for a in ARMS)
    workers: int = 2
    # the training configs themselves, each arm and seed changing what it must with replace:
    # [selfgen] is brisk train selfgen's (its stride is the experiment's), [train] brisk train
    # proposal's (init, dataset, out_dir, data, weights, profile, seed, stride and temperature
    # are set per job)
    selfgen: SelfGenOptions = field(default_factory=SelfGenOptions)
    train: ProposalTrainConfig = field(default_factory=ProposalTrainConfig)
    eval: EvalSection = field(default_factory=EvalSection)

    def __post_init__(self) -> None:
        check_plan(self.arms, {a.name for a in ARMS}, self.seeds, self.workers)


def _arm(name: str) -> Arm:
    return next(a for a in ARMS if a.name == name)


def _job(cfg: ExperimentConfig, data_dir: str, arm_name: str, seed: int) -> dict[str, Any]:
    """Train (unless the base arm) and evaluate one arm × seed; returns the evaluation. A signal
    stops the training at its next step (with a checkpoint) and the evaluation at once."""
    with stop_signals() as stop:  # in a worker, its flag for life
        return _train_and_evaluate(cfg, data_dir, arm_name, seed, stop)


def _train_and_evaluate(
    cfg: ExperimentConfig, data_dir: str, arm_name: str, seed: int, stop: StopSignals
) -> dict[str, Any]:
    import torch

    from brisk.runtime.experiment.evaluate import evaluate_checkpoint
    from brisk.runtime.train.proposal import train_proposal

    torch.set_num_threads(1)
    arm = _arm(arm_name)
    run, done = job_dir(cfg.out_dir, arm.name, seed)
    if done is not None:
        return done
    checkpoint = Path(cfg.base)
    if arm.data != "base":
        pcfg = cfg.train.replace(
            init=cfg.base, dataset=data_dir, out_dir=str(run), data=arm.data,
            weights=arm.weights, profile=arm.profile, seed=seed, stride=cfg.stride,
            temperature=cfg.selfgen.temperature,
        )  # fmt: skip
        checkpoint = run / "final"
        if not (checkpoint / "trainer_state.pt").exists():
            train_proposal(pcfg, resume=True, show_progress=False)
    problems, grader = held_out_problems(cfg.base, cfg.eval.problems, cfg.eval.problem_seed,
                                         cfg.eval.task)  # fmt: skip
    blocks = run / "blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    with stop.abortable():  # rerun whole: only eval.json marks the job done
        ev = evaluate_checkpoint(
            checkpoint, [p.prompt for p in problems], [p.answer for p in problems], arm=arm.name,
            seed=seed, stride=cfg.stride, temperature=cfg.eval.temperature,
            max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size,
            log_blocks=blocks, grader=grader,
        )  # fmt: skip
    atomic_write_text(run / "eval.json", json.dumps(ev.to_dict(), indent=2))
    return ev.to_dict()


def run_experiment(cfg: ExperimentConfig, show_progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the ablation; returns the summary that ``summary.json`` holds. SIGINT or
    SIGTERM ends it with :class:`~brisk._interrupt.Interrupted` (module docstring)."""
    with stop_signals() as stop:
        return _run(cfg, show_progress, stop)


def _run(cfg: ExperimentConfig, show_progress: bool, stop: StopSignals) -> dict[str, Any]:
    from rich.console import Console

    from brisk.runtime.experiment.evaluate import CheckpointEval
    from brisk.runtime.train.selfgen import generate_dataset

    console = Console(stderr=True, quiet=not show_progress)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    # 1. The base checkpoint.
    with experiment_step("training the base model"):
        ensure_checkpoint(cfg.base, cfg.base_config, console, show_progress)
    timings["base_s"] = time.monotonic() - t0

    # 2. Self-generated data from the base, with the deployed decoder.
    data_dir = out / "data"
    console.print(f"self-generated data → {data_dir}")
    t = time.monotonic()
    with experiment_step("generating the dataset"):
        generate_dataset(cfg.base, data_dir, cfg.selfgen.replace(stride=cfg.stride),
                         show_progress=show_progress)  # fmt: skip
    timings["selfgen_s"] = time.monotonic() - t

    # 3. Arms × seeds, trained and evaluated in worker processes (longest jobs first).
    jobs = [(a, seed) for a in cfg.arms if a != "base" for seed in cfg.seeds]
    jobs += [("base", seed) for seed in cfg.seeds if "base" in cfg.arms]
    t = time.monotonic()
    evals: dict[tuple[str, int], CheckpointEval] = {}

    def done(count: int, a: str, seed: int, ev: dict[str, Any]) -> None:
        evals[(a, seed)] = CheckpointEval(**{k: tuple(v) if isinstance(v, list) else v
                                             for k, v in ev.items()})  # fmt: skip
        console.print(
            f"[{count}/{len(jobs)}] {a} seed {seed}: acc {ev['accuracy']:.3f}, "
            f"TPF {ev['tpf_run']:.3f}, rejection {ev['rejection']:.3f} "
            f"({(time.monotonic() - t0) / 60:.1f} min)"
        )

    with experiment_step(f"running the arm × seed jobs in {out / 'arms'}"):
        run_jobs(cfg.workers, _job, jobs, (cfg, str(data_dir)), done)
    timings["arms_s"] = time.monotonic() - t

    # 4. The table, the plots and the mechanism report of the best arm (abortable: a rerun
    # writes them again from the jobs' results).
    with experiment_step("writing the summary; every job's result is kept"), stop.abortable():
        return _summarize(cfg, evals, timings, t0, console)


def _summarize(
    cfg: ExperimentConfig, evals: dict[tuple[str, int], Any], timings: dict[str, float],
    t0: float, console: Any,
) -> dict[str, Any]:  # fmt: skip
    from brisk.runtime.experiment.evaluate import summarize
    from brisk.runtime.experiment.table import markdown_table, plot_summaries

    out = Path(cfg.out_dir)
    ordered = [evals[(a, seed)] for a in cfg.arms for seed in cfg.seeds]
    summaries = summarize(ordered)
    labels = {a.name: a.labels for a in ARMS}
    table = markdown_table(summaries, labels, ("Training data", "W."),
                           baseline="base" if "base" in cfg.arms else None)  # fmt: skip
    plot_summaries(summaries, out / "arms.png")
    trained = [sm for sm in summaries if sm.arm != "base"]
    best = max(trained, key=lambda sm: sm.metrics["tpf_run"].mean).arm if trained else "base"
    from brisk.runtime.train.plots import plot_weight_evolution

    for a in cfg.arms:
        metrics = out / "arms" / a / f"seed{cfg.seeds[0]}" / "metrics.jsonl"
        if metrics.exists():
            plot_weight_evolution(metrics, out / f"weights_{a}.png")
    from brisk.mechanism.report import analyze, write_report

    blocks = out / "arms" / best / f"seed{cfg.seeds[0]}" / "blocks"
    write_report(analyze(blocks, draws=200), out / "mechanism")  # brisk mechanism report
    timings["total_s"] = time.monotonic() - t0
    summary = {
        "config": cfg.to_dict(),
        "arms": [sm.to_dict() for sm in summaries],
        "evals": [e.to_dict() for e in ordered],
        "best_arm": best,
        "timings": timings,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(
        f"# Proposal-training ablation ({len(cfg.seeds)} seeds, N = {cfg.stride}, "
        f"T = {cfg.eval.temperature}, {cfg.eval.problems} held-out problems)\n\n{table}\n"
        f"Cells: mean over seeds [95 % Student-t interval]. tok/s on one CPU thread with block "
        f"logging on. W.: D = BRISK dynamic, S = BRISK static, U = uniform. Best arm by "
        f"whole-run TPF: {best}.\n\n{_profile_table(cfg, ordered)}"
    )
    console.print(table)
    return summary


def _profile_table(cfg: ExperimentConfig, evals: Sequence[Any]) -> str:
    """Per arm, the acceptance rate a_i at each position pooled over seeds' verify rounds."""
    import numpy as np

    M = cfg.stride - 1
    lines = ["Acceptance profile a_i (pooled over seeds)\n",
             "| arm | " + " | ".join(f"a_{i + 1}" for i in range(M)) + " |",
             "|---|" + "---:|" * M]  # fmt: skip
    for arm in cfg.arms:
        rows = [e for e in evals if e.arm == arm]
        reached = np.sum([e.reached for e in rows], axis=0)
        accepted = np.sum([e.accepted for e in rows], axis=0)
        rates = accepted / np.maximum(reached, 1)
        lines.append(f"| {arm} | " + " | ".join(f"{r:.3f}" for r in rates) + " |")
    return "\n".join(lines) + "\n"
