"""What every ablation command shares: the plan's checks, the checkpoint it starts from, the
held-out evaluation every row gets, the worker pool that runs its arm × seed jobs, the run under
way (:class:`ExperimentRun`: its console, clock and step timings), and how it stops.

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
from typing import TYPE_CHECKING, Any, TypeVar

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

if TYPE_CHECKING:
    from brisk.experiments.evaluate import CheckpointEval, Decoding

C = TypeVar("C")
R = TypeVar("R")

__all__ = [
    "EvalSection",
    "ExperimentPlan",
    "ExperimentRun",
    "HeldOut",
    "HeldOutProblems",
    "begin_experiment",
    "ensure_checkpoint",
    "evaluate_held_out",
    "experiment_step",
    "held_out_problems",
    "job_dir",
    "read_eval",
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
class HeldOutProblems:
    """The held-out problems' prompts and answers, and their grader's name."""

    prompts: list[str]
    answers: list[Any]
    grader: str


@dataclass(frozen=True)
class HeldOut:
    """The evaluation every row of an ablation gets: ``section``'s problems of the world of the
    checkpoint ``world`` (:meth:`problems`) decoded at ``stride`` with ``section``'s settings,
    on ``device`` in ``dtype``, with the MASK id ``mask_token_id`` (None: the checkpoint's own;
    :meth:`evaluate`)."""

    world: str
    section: EvalSection
    stride: int
    device: str
    dtype: str
    mask_token_id: int | None = None

    def problems(self) -> HeldOutProblems:
        """The section's problems (the same for every arm and seed: :func:`held_out_problems`)."""
        e = self.section
        problems, grader = held_out_problems(self.world, e.problems, e.problem_seed, e.task)
        return HeldOutProblems([p.prompt for p in problems], [p.answer for p in problems], grader)

    def evaluate(
        self,
        checkpoint: str | Path,
        problems: HeldOutProblems,
        name: str,
        seed: int,
        *,
        corrector: Any = None,
        log_blocks: Path | None = None,
        shadow: bool = False,
    ) -> CheckpointEval:
        """``problems`` decoded from ``checkpoint`` as the row ``name`` with decode seed
        ``seed`` (head on with ``corrector``; ``log_blocks`` and ``shadow`` as
        :func:`~brisk.experiments.evaluate.evaluate_checkpoint` takes them) and scored."""
        from brisk.experiments.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(
            checkpoint,
            problems.prompts,
            problems.answers,
            arm=name,
            seed=seed,
            decoding=self.decoding,
            corrector=corrector,
            log_blocks=log_blocks,
            shadow=shadow,
            grader=problems.grader,
        )

    @property
    def decoding(self) -> Decoding:
        """How every row is decoded: ``section``'s settings at ``stride``, where it runs (the
        fields of :class:`~brisk.experiments.evaluate.Decoding`, in order)."""
        from brisk.experiments.evaluate import Decoding

        e = self.section
        settings = (self.stride, e.temperature, e.max_new_tokens, e.batch_size)
        return Decoding(*settings, self.device, self.dtype, self.mask_token_id)


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

    def decode_problems(
        self,
        decode: Callable[..., R],
        checkpoint: str | Path,
        out: Path,
        options: Any,
        show_progress: bool = False,
    ) -> R:
        """``decode(checkpoint, out, options, show_progress, device=, dtype=)``, a decode of the
        deployed decoder over a task's problems (``brisk train selfgen``'s
        :func:`~brisk.runtime.train.selfgen.generate_dataset`, ``brisk train corrector
        collect``'s :func:`~brisk.experiments.heads.collect_once`), with the plan's stride, MASK
        id (:func:`with_mask`) and placement."""
        staged = with_mask(self, options.replace(stride=self.stride))
        return decode(
            checkpoint,
            out,
            staged,
            show_progress=show_progress,
            device=self.device,
            dtype=self.dtype,
        )

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


@dataclass
class ExperimentRun:
    """An experiment under way (:func:`begin_experiment`): its output directory, its console (on
    stderr, quiet without progress), whether it shows progress, the flag SIGINT and SIGTERM set
    (``stop``), its start on the monotonic clock (``t0``) and the seconds of its steps that its
    summary records (``timings``)."""

    out: Path
    console: Any
    show_progress: bool
    stop: StopSignals
    t0: float = field(default_factory=time.monotonic)
    timings: dict[str, float] = field(default_factory=dict)

    def ensure_checkpoint(
        self, checkpoint: str, base_config: str, doing: str, *, timing: str | None = None
    ) -> None:
        """The experiment's first step, ``doing``: train the base model of ``base_config`` into
        ``checkpoint`` unless it exists already (:func:`ensure_checkpoint`; :meth:`step`)."""
        with self.step(doing, timing=timing):
            ensure_checkpoint(checkpoint, base_config, self.console, self.show_progress)

    @contextmanager
    def step(self, doing: str, *, timing: str | None = None) -> Iterator[None]:
        """A step of the experiment, ``doing`` (:func:`experiment_step`: an interruption ends the
        experiment with one line), its seconds recorded as ``timings[timing]`` where given."""
        with experiment_step(doing), self.timed(timing):
            yield

    @contextmanager
    def timed(self, key: str | None) -> Iterator[None]:
        """The block's seconds, recorded as ``timings[key]`` (None: not recorded)."""
        start = time.monotonic()
        yield
        if key is not None:
            self.timings[key] = time.monotonic() - start

    @contextmanager
    def summarizing(self) -> Iterator[None]:
        """The last step, the summary written from the jobs' results: an interruption ends it at
        once (a rerun writes it again) and keeps every job's result."""
        with (
            experiment_step("writing the summary; every job's result is kept"),
            self.stop.abortable(),
        ):
            yield

    def job_done(self, count: int, total: int, name: str, seed: int, what: str) -> None:
        """The line printed as a job finishes: ``[count/total] name seed s: what (minutes since
        the start)``."""
        minutes = (time.monotonic() - self.t0) / 60
        self.console.print(f"[{count}/{total}] {name} seed {seed}: {what} ({minutes:.1f} min)")

    def eval_done(self, count: int, total: int, name: str, seed: int, ev: dict[str, Any]) -> None:
        """:meth:`job_done` of a job whose result is a held-out evaluation ``ev``
        (:meth:`HeldOut.evaluate`'s, as a dict): its accuracy, TPF and rejection."""
        what = f"acc {ev['accuracy']:.3f}, TPF {ev['tpf_run']:.3f}, rejection {ev['rejection']:.3f}"
        self.job_done(count, total, name, seed, what)


@contextmanager
def begin_experiment(cfg: Config, show_progress: bool) -> Iterator[ExperimentRun]:
    """An experiment's run for the block: SIGINT and SIGTERM routed to its ``stop`` flag
    (:func:`~brisk._interrupt.stop_signals`), its output directory created, holding
    ``experiment.json`` (the config it runs), and its clock started."""
    from rich.console import Console

    with stop_signals() as stop:
        out = Path(cfg.out_dir)  # type: ignore[attr-defined]
        out.mkdir(parents=True, exist_ok=True)
        (out / "experiment.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        yield ExperimentRun(out, Console(stderr=True, quiet=not show_progress), show_progress, stop)


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


def read_eval(saved: dict[str, Any]) -> CheckpointEval:
    """A :class:`~brisk.experiments.evaluate.CheckpointEval` from its dict as a job returned it
    or ``eval.json`` holds it (lists back to tuples)."""
    from brisk.experiments.evaluate import CheckpointEval

    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()}
    return CheckpointEval(**fields)


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
) -> CheckpointEval:
    """The evaluation every row of an ablation's table gets: ``held_out``'s problems decoded
    from ``checkpoint`` with decode seed ``seed`` (head on with ``corrector``), every verify
    round logged to ``run/blocks``; a signal stops it at once (rerun whole: only ``eval.json``
    marks a job done)."""
    problems = held_out.problems()
    blocks = run / "blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    with stop.abortable():
        return held_out.evaluate(
            checkpoint, problems, name, seed, corrector=corrector, log_blocks=blocks
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
