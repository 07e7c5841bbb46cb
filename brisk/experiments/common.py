"""What every ablation command shares: the plan's checks, the checkpoint it starts from, the
held-out evaluation every row gets, the worker pool that runs its arm × seed jobs, and how it
stops.

An experiment resumes by being rerun: every step whose output exists is skipped, and the step
that was cut short continues where it stopped (training from its newest checkpoint, data from
its last whole part, a job's evaluation from scratch). SIGINT or SIGTERM therefore stops the
step under way at its next safe point (:mod:`brisk._interrupt`, one flag for the process; the
workers are told too) and ends the experiment with one line saying what stays
(:func:`experiment_step`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import active_children, get_context
from pathlib import Path
from typing import Any, TypeVar

from brisk._hf import quiet_transformers
from brisk._interrupt import (
    Interrupted,
    StopSignals,
    signals_blocked,
    stop_signals,
    worker_stop_signals,
)
from brisk.runtime.configs import Config
from brisk.runtime.tasks.spec import TaskSpec
from brisk.runtime.train.fields import MaskId

C = TypeVar("C")

__all__ = [
    "EvalSection",
    "ExperimentPlan",
    "HeldOut",
    "begin_experiment",
    "ensure_checkpoint",
    "evaluate_held_out",
    "experiment_step",
    "held_out_problems",
    "job_dir",
    "job_line",
    "run_jobs",
    "with_mask",
]


@dataclass(frozen=True)
class EvalSection(Config):
    """``[eval]``: the held-out problems every row of an ablation is decoded on, and how."""

    task: TaskSpec = field(default_factory=TaskSpec)  # empty: the base's world, test split
    problems: int = 200
    temperature: float = 1.0
    max_new_tokens: int = 160
    problem_seed: int = 1
    batch_size: int = 100


@dataclass(frozen=True)
class HeldOut:
    """What :func:`evaluate_held_out` decodes: ``section``'s problems of the world of the
    checkpoint ``world`` at ``stride``, on ``device`` in ``dtype``, with the MASK id
    ``mask_token_id`` (None: the checkpoint's own)."""

    world: str
    section: EvalSection
    stride: int
    device: str
    dtype: str
    mask_token_id: int | None = None


@dataclass(frozen=True)
class ExperimentPlan(MaskId):
    """What every experiment's config holds: where it writes, the base model's training config,
    the stride, the seeds, the jobs run at once and where they run, and the base's MASK id
    (``mask_token_id``, for one without a MASK token: every stage gets it, :func:`with_mask`).
    A subclass declares its ``arms`` (their names: ``known_arms``) and its own defaults."""

    out_dir: str = "runs/experiment"
    base_config: str = "configs/paper_base.toml"  # trains the base when it does not exist
    stride: int = 8
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ()
    workers: int = 2
    # where every job runs (auto: the GPU where one exists) and the dtype models decode in
    # (auto: bfloat16 on a GPU, float32 on the CPU); training runs there too
    device: str = "auto"
    dtype: str = "auto"

    def known_arms(self) -> Collection[str]:
        return ()

    def __post_init__(self) -> None:
        """Arms must be known, seeds distinct and non-empty, workers ≥ 1 (errors name the
        field)."""
        known = self.known_arms()
        for name in self.arms:
            if name not in known:
                raise ValueError(f"arms: unknown arm {name!r} (known: {', '.join(sorted(known))})")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: need distinct seeds, got {self.seeds!r}")
        if self.workers < 1:
            raise ValueError(f"workers: must be ≥ 1, got {self.workers!r}")
        super().__post_init__()


def begin_experiment(cfg: Config, show_progress: bool) -> tuple[Any, Path]:
    """The experiment's console (on stderr, quiet without progress) and its output directory,
    created, holding ``experiment.json`` (the config it runs)."""
    from rich.console import Console

    out = Path(cfg.out_dir)  # type: ignore[attr-defined]
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    return Console(stderr=True, quiet=not show_progress), out


def ensure_checkpoint(checkpoint: str, base_config: str, console: Any, show_progress: bool) -> None:
    """Train the base model of ``base_config`` into ``checkpoint`` unless it exists already."""
    if (Path(checkpoint) / "config.json").is_file():
        return
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.runtime.train.base.recipe import train_base

    console.print(f"training the base model ({base_config}) → {checkpoint}")
    cfg = BaseTrainConfig.load(base_config).replace(out_dir=str(Path(checkpoint).parent))
    trained = train_base(cfg, show_progress=show_progress)
    if trained.checkpoint.resolve() != Path(checkpoint).resolve():
        raise ValueError(f"base: training wrote {trained.checkpoint}, expected {checkpoint}")


@contextmanager
def experiment_step(doing: str) -> Iterator[None]:
    """A step of an experiment (``doing``: "training the base model"): an interruption inside
    it ends the experiment with one line, what the step kept and that rerunning the command
    continues (an experiment has no ``--resume``). A ``KeyboardInterrupt`` is work cut short
    inside :meth:`~brisk._interrupt.StopSignals.abortable`, which keeps nothing of its own."""
    try:
        yield
    except KeyboardInterrupt as err:
        kept = f": {err.what}" if isinstance(err, Interrupted) else ""
        raise Interrupted(f"while {doing}{kept}; rerun the same command to continue") from None


def run_jobs(
    workers: int,
    job: Callable[..., dict[str, Any]],
    jobs: Sequence[tuple[str, int]],
    args: Sequence[Any],
    done: Callable[[int, str, int, dict[str, Any]], None],
) -> dict[tuple[str, int], dict[str, Any]]:
    """``job(*args, arm, seed)`` for every (arm, seed) in ``workers`` spawned processes (one torch
    thread each, set by the job); ``done(count, arm, seed, result)`` as each one finishes.

    On SIGINT or SIGTERM (to this process, or a job's own) the jobs not started are cancelled
    and the workers are sent SIGTERM, which stops each job at its next safe point (a training
    run with a checkpoint, an evaluation at once); once they have ended,
    :class:`~brisk._interrupt.Interrupted` says how many jobs finished. A worker routes the
    signals to its own flag before it unblocks them (:func:`_start_worker`), so one that lands
    while it starts waits."""
    results: dict[tuple[str, int], dict[str, Any]] = {}
    spawn = get_context("spawn")
    with (
        stop_signals() as stop,
        ProcessPoolExecutor(workers, spawn, initializer=_start_worker) as pool,
    ):
        with signals_blocked():  # the workers start here, at submit, and inherit the mask
            futures = {pool.submit(job, *args, arm, seed): (arm, seed) for arm, seed in jobs}
        waiting: set[Future[dict[str, Any]]] = set(futures)
        stopped = told = False  # a job stopped; the workers were told to stop
        while waiting:
            finished, waiting = wait(waiting, timeout=0.1, return_when=FIRST_COMPLETED)
            for future in finished:
                if future.cancelled():
                    continue
                arm, seed = futures[future]
                try:
                    results[(arm, seed)] = future.result()
                except KeyboardInterrupt:  # the job stopped at a safe point (Interrupted too)
                    stopped = True
                    continue
                done(len(results), arm, seed, results[(arm, seed)])
            if (stop.requested or stopped) and not told:
                told = True
                for future in waiting:
                    future.cancel()  # those not started (not shutdown(), which would not wait)
                for worker in active_children():
                    worker.terminate()  # SIGTERM, which the worker's flag takes
            waiting = {f for f in waiting if not f.cancelled()}  # wait() never returns these
    if told:
        raise Interrupted(
            f"after {len(results)}/{len(jobs)} jobs had finished; an unfinished training keeps "
            "its newest checkpoint"
        )
    return results


def _start_worker() -> None:
    """A job worker's start: SIGINT and SIGTERM to its own flag
    (:func:`~brisk._interrupt.worker_stop_signals`), transformers' loading and saving bars off
    (jobs run quiet: the experiment prints a line per finished job)."""
    worker_stop_signals()
    quiet_transformers()


def job_line(count: int, total: int, name: str, seed: int, ev: dict[str, Any], t0: float) -> str:
    """The line an experiment prints as a job finishes: ``[count/total] name seed s: acc …,
    TPF …, rejection … (minutes since t0)``."""
    return (
        f"[{count}/{total}] {name} seed {seed}: acc {ev['accuracy']:.3f}, "
        f"TPF {ev['tpf_run']:.3f}, rejection {ev['rejection']:.3f} "
        f"({(time.monotonic() - t0) / 60:.1f} min)"
    )


def job_dir(
    out_dir: str, arm: str, seed: int, kind: str = "arms"
) -> tuple[Path, dict[str, Any] | None]:
    """An arm × seed's run directory ``<out_dir>/<kind>/<arm>/seed<seed>`` (created) and its
    saved evaluation, if the job finished before (``eval.json``, written atomically last):
    what makes the experiments resume."""
    run = Path(out_dir) / kind / arm / f"seed{seed}"
    result_file = run / "eval.json"
    if result_file.exists():
        return run, dict(json.loads(result_file.read_text()))
    run.mkdir(parents=True, exist_ok=True)
    return run, None


def with_mask(plan: MaskId, stage: C) -> C:
    """A stage's config (a decode's options, a training config) with the experiment's MASK id
    where the experiment gives one (``mask_token_id``); else the stage's own setting."""
    if plan.mask_token_id is None:
        return stage
    return stage.replace(mask_token_id=plan.mask_token_id)  # type: ignore[attr-defined, no-any-return]


def evaluate_held_out(
    held_out: HeldOut,
    checkpoint: Path,
    run: Path,
    name: str,
    seed: int,
    stop: StopSignals,
    corrector: Any = None,
) -> Any:
    """The evaluation every row of an ablation's table gets: ``held_out``'s problems decoded
    from ``checkpoint`` with decode seed ``seed`` (head on with ``corrector``), every verify
    round logged to ``run/blocks``; a signal stops it at once (rerun whole: only ``eval.json``
    marks a job done)."""
    from brisk.experiments.evaluate import evaluate_checkpoint

    e = held_out.section
    problems, grader = held_out_problems(held_out.world, e.problems, e.problem_seed, e.task)
    blocks = run / "blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    with stop.abortable():
        return evaluate_checkpoint(
            checkpoint,
            [p.prompt for p in problems],
            [p.answer for p in problems],
            arm=name,
            seed=seed,
            stride=held_out.stride,
            temperature=e.temperature,
            max_new_tokens=e.max_new_tokens,
            batch_size=e.batch_size,
            log_blocks=blocks,
            grader=grader,
            corrector=corrector,
            device=held_out.device,
            dtype=held_out.dtype,
            mask_token_id=held_out.mask_token_id,
        )


def held_out_problems(
    checkpoint: str | Path, n: int, seed: int, task: Any = None
) -> tuple[list[Any], str]:
    """``n`` held-out problems (the same for every arm and seed) and their grader's name: of
    ``task`` (a :class:`~brisk.runtime.tasks.spec.TaskSpec`), by default the test split of the
    world the checkpoint was trained on (its ``train_config.json``)."""
    from brisk.runtime.loader import load_tokenizer

    spec = task if task is not None else TaskSpec()
    resolved = spec.resolve(n=n, seed=seed, split="test", checkpoint=checkpoint)
    problems = resolved.problems(load_tokenizer(checkpoint, where="checkpoint"))
    if not problems:
        raise ValueError("eval.task: the selection holds no problems")
    grader = resolved.describe().get("grader")
    if grader is None:
        raise ValueError("eval.task: the evaluation needs answers and a grader")
    return problems, grader
