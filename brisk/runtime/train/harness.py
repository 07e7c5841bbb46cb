"""The one training loop: every ``brisk train`` recipe (base, proposal, drafter, ar, corrector)
runs through :func:`train`, which owns what a run of steps needs beyond its batches and loss.

A recipe (:class:`Recipe`) says what it trains and how one step goes; the harness does the rest,
the same way for every recipe:

- **ranks**: :class:`~brisk.runtime.train.distributed.Dist` from torchrun's environment (one
  process without it), the device and precision of the run;
- **the run directory** (:func:`~brisk.runtime.train.resume.start_checkpoint`): a used
  directory is refused without ``resume``, a finished run is never trained again, a run is
  continued only with the configuration it was started with;
- **resume**: the newest ``checkpoint-NNNNNN/``'s trainer state (``trainer_state.pt``: step,
  optimizer or its FSDP shards, the global RNG states, the size of ``metrics.jsonl``, the
  recipe's own state) is loaded before the first step, so a resumed run ends bit-identical on
  CPU to one that was never stopped; resuming is the default of every recipe;
- **metrics** (``metrics.jsonl``, rank 0): one JSON object per line, every one with an
  ``"event"`` (``start``, ``train``, ``eval``, ``budget``, ``end``) and, but for ``start``,
  the ``"step"`` it was written at (steps taken); ``train`` records are written after the
  first step, every ``log_every`` steps and after the last;
- **progress**: a bar of steps or of tokens, on rank 0;
- **stop signals**: SIGINT or SIGTERM stops every rank at the same step (the flag is
  all-reduced) with a checkpoint of the step reached
  (:func:`~brisk.runtime.train.resume.interrupted_at`);
- **saves**: ``checkpoint-NNNNNN/`` every ``save_every`` steps and ``final/`` (no trainer
  state: a finished run is never resumed), each built in ``.<name>.tmp`` and renamed into
  place (:func:`~brisk._atomic.building_dir`); under FSDP every rank writes its model and
  optimizer shards into the checkpoint's ``sharded/`` and rank 0 the gathered weights beside
  them;
- **a wall budget** (a recipe's ``max_minutes``: rank 0's clock decides for every rank);
- **the result** (:class:`TrainResult`): the final checkpoint, the log's records, the steps
  taken, the training wall time and the recipe's outcome (its final evaluation).

A new recipe fills in :meth:`Recipe.build` (the module it trains and its optimizer),
:meth:`Recipe.step` (one optimizer step, returning the fields of its ``train`` record) and
:meth:`Recipe.write` (what a checkpoint directory holds), and, where it has them,
:meth:`Recipe.state_dict` (what else resuming needs), :meth:`Recipe.evaluate` (now and then
during the run) and :meth:`Recipe.finish` (after the final save). ``docs/training.md`` trains a
recipe of its own this way.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from brisk._atomic import building_dir
from brisk._interrupt import Interrupted, StopSignals, stop_signals
from brisk.runtime.configs import Config
from brisk.runtime.loader import training_placement
from brisk.runtime.train.common import cpu_settings
from brisk.runtime.train.distributed import Dist, full_state_dict, load_sharded, save_sharded
from brisk.runtime.train.resume import (
    METRICS,
    STATE,
    MetricsLog,
    interrupted_at,
    load_state,
    restore_rng,
    rng_state,
    start_checkpoint,
)

__all__ = ["Recipe", "Run", "StepRecord", "TrainResult", "train"]

R = TypeVar("R")


@dataclass(frozen=True)
class TrainResult(Generic[R]):
    """What a training run returns, whatever its recipe."""

    checkpoint: Path  # final/
    history: list[dict[str, Any]]  # rank 0: every record of metrics.jsonl; others: their own
    steps: int  # optimizer steps taken
    wall_s: float  # training wall time, the final save and evaluation excluded
    outcome: R  # the recipe's (Recipe.finish): its final evaluation, or None


@dataclass(frozen=True)
class StepRecord:
    """One step's record fields (``loss`` among them) and the progress bar's text."""

    fields: dict[str, Any]
    info: str = ""


@dataclass
class Run:
    """What the harness gives a recipe: the ranks, where the run computes and writes, the
    checkpoint it resumes from (None: a new run) and its trainer state, and the log."""

    dist: Dist
    device: torch.device
    precision: str
    out: Path
    start: Path | None
    state: dict[str, Any]
    stop: StopSignals
    show_progress: bool
    step: int = 0  # optimizer steps taken
    clock: float = 0.0  # time.monotonic() at the run's start (a resumed run's clock goes on)
    _log: Callable[[dict[str, Any]], None] | None = None

    def log(self, record: dict[str, Any]) -> None:
        """Write ``record`` to ``metrics.jsonl`` (rank 0; other ranks keep it in memory)."""
        assert self._log is not None, "the log opens after Recipe.build"
        self._log(record)

    def elapsed(self) -> float:
        """Seconds of training so far, across resumes."""
        return time.monotonic() - self.clock


C = TypeVar("C", bound=Config)


class Recipe(Generic[C, R]):
    """A training recipe: its batches, its loss and its record; :func:`train` runs it.

    :meth:`build` sets :attr:`model` (the module a checkpoint holds; under FSDP the sharded
    one) and :attr:`optimizer`. The run counts steps up to :attr:`total`, or, with
    ``unit = "tokens"``, trained tokens (:meth:`completed`) up to it."""

    label: str = "train"  # the progress bar's title
    unit: ClassVar[str] = "steps"  # what the bar and the budget count: steps or tokens
    config_file: ClassVar[str] = "train_config.json"  # the config a checkpoint is compared by
    model: Any
    optimizer: torch.optim.Optimizer
    tokens: int = 0  # trained tokens, for a recipe counted in them (its step adds to it)

    def __init__(self, cfg: C) -> None:
        self.cfg = cfg

    # --- what a recipe fills in ---------------------------------------------------------------

    def build(self, run: Run) -> None:
        """Build :attr:`model` (with ``run.start``'s weights when resuming) and
        :attr:`optimizer`; check the data before anything is written."""
        raise NotImplementedError

    def step(self, run: Run, step: int) -> StepRecord:
        """Take optimizer step ``step`` (0-based) and return its record's fields."""
        raise NotImplementedError

    def write(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """Write the trained model into a checkpoint ``directory`` (rank 0): ``weights`` is the
        gathered state dict of an FSDP model, else None (the model's own)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What else resuming needs (data position, trackers, the recipe's own RNGs)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back :meth:`state_dict`'s part of a checkpoint's trainer state."""

    def begin(self, run: Run) -> None:
        """After the state is restored, before the first step (a new run's first records)."""

    def evaluate(self, run: Run, done: int, finished: bool) -> None:
        """After step ``done``'s record is written: evaluate now and then (log the result)."""

    def finish(self, run: Run, final: Path) -> R:
        """After ``final/`` is saved: the run's outcome (a final evaluation; logged as
        ``eval``). A signal here ends only the evaluation: the trained model is saved."""
        return None  # type: ignore[return-value]

    # --- what the harness asks ------------------------------------------------------------------

    @property
    def total(self) -> int:
        """Steps to train (``cfg.steps``), or tokens (``cfg.token_budget``)."""
        budget = self.cfg.token_budget if self.unit == "tokens" else self.cfg.steps
        return int(budget)

    def completed(self, step: int) -> int:
        """How far the run is after ``step`` steps, in :attr:`unit`: the steps, or the tokens
        trained (:attr:`tokens`, which a recipe counted in tokens adds to at every step)."""
        return self.tokens if self.unit == "tokens" else step

    @property
    def fsdp(self) -> bool:
        return bool(getattr(self.cfg, "fsdp", False))

    @property
    def max_minutes(self) -> float:
        return float(getattr(self.cfg, "max_minutes", math.inf))

    def where(self, step: int) -> int | str:
        """How far the run got, for the message of a stopped run."""
        if self.unit == "steps":
            return self.total
        return f"{self.completed(step):,}/{self.total:,} {self.unit}"


def train(
    recipe: Recipe[Any, R], show_progress: bool = True, *, resume: bool = True
) -> TrainResult[R]:
    """Run ``recipe`` into its ``cfg.out_dir`` (module docstring). With ``resume`` (every
    recipe's default) an interrupted run there is continued, else a directory holding a run is
    refused. SIGINT or SIGTERM ends it between steps with a checkpoint and
    :class:`~brisk._interrupt.Interrupted`."""
    cfg = recipe.cfg
    with cpu_settings(int(getattr(cfg, "threads", 1))), stop_signals() as stop:
        return _Harness(recipe, show_progress, resume, stop).run()


class _Harness(Generic[R]):
    """The loop of :func:`train`, read top to bottom in :meth:`run`."""

    def __init__(
        self, recipe: Recipe[Any, R], show_progress: bool, resume: bool, stop: StopSignals
    ) -> None:
        self.recipe = recipe
        self.show_progress = show_progress
        self.resume = resume
        self.stop = stop
        self.metrics: MetricsLog | None = None

    def run(self) -> TrainResult[R]:
        recipe, cfg = self.recipe, self.recipe.cfg
        dist = Dist.from_env(fsdp=recipe.fsdp)
        device, precision = training_placement(
            getattr(cfg, "device", "cpu"), getattr(cfg, "precision", "fp32"), distributed=dist.group
        )
        out = Path(cfg.out_dir)  # type: ignore[attr-defined]
        start = start_checkpoint(out, self.resume, cfg, recipe.config_file)
        dist.barrier()  # every rank reads the directory before rank 0 writes to it
        state = load_state(start) if start is not None else {}
        shown = self.show_progress and dist.rank == 0
        run = self.run_ = Run(dist, device, precision, out, start, state, self.stop, shown)
        torch.manual_seed(int(getattr(cfg, "seed", 0)))  # a new model's weights
        recipe.build(run)
        if start is not None:
            if recipe.fsdp:
                load_sharded(start, recipe.model, recipe.optimizer)
            else:
                recipe.optimizer.load_state_dict(state["optimizer"])
            recipe.load_state_dict(state)
            restore_rng(state["rng"])
            run.step = state["step"]
        history: list[dict[str, Any]] = []
        if dist.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsLog(out / METRICS, keep=_kept_log(state, out / METRICS))
            history = self.metrics.records
        run._log = self.metrics.write if self.metrics is not None else history.append
        run.clock = time.monotonic() - state.get("elapsed_s", 0.0)
        if start is None:
            params = sum(p.numel() for p in recipe.model.parameters())
            run.log({"event": "start", "params": params, "config": cfg.to_dict()})
        recipe.begin(run)
        self.loop(run)

        # The trained model is saved first: an evaluation cut short by a signal loses only
        # itself.
        wall = run.elapsed()
        final = self.save(out / "final", resumable=False)
        try:
            with self.stop.abortable():
                outcome = recipe.finish(run, final)
        except KeyboardInterrupt:
            raise Interrupted(
                f"during the final evaluation; the trained model is saved in {final}"
            ) from None
        end = {"event": "end", "step": run.step, "train_wall_s": wall, "wall_s": run.elapsed()}
        if recipe.unit == "tokens":
            end["tokens"] = recipe.tokens
        run.log(end)
        if self.metrics is not None:
            self.metrics.close()
        dist.barrier()
        return TrainResult(final, history, run.step, wall, outcome)

    def loop(self, run: Run) -> None:
        recipe, dist = self.recipe, run.dist
        log_every = int(getattr(recipe.cfg, "log_every", 1))
        save_every = int(getattr(recipe.cfg, "save_every", 0) or 0)
        saved_at = run.step if run.start is not None else -1  # the newest checkpoint's step
        progress = Progress(
            TextColumn(recipe.label),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + recipe.unit),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            disable=not run.show_progress,
        )
        with progress:
            done = recipe.completed(run.step)
            bar = progress.add_task("train", total=recipe.total, completed=done, info="")
            while recipe.completed(run.step) < recipe.total:
                # Stop between steps, every rank at the same one, with a checkpoint of it.
                if dist.any(run.stop.requested, run.device):
                    self.interrupted(run, saved_at)
                record = recipe.step(run, run.step)
                run.step += 1
                finished = recipe.completed(run.step) >= recipe.total
                if run.step == 1 or run.step % log_every == 0 or finished:
                    fields = {"event": "train", "step": run.step, **record.fields}
                    run.log({**fields, "elapsed_s": run.elapsed()})
                progress.update(
                    bar, completed=min(recipe.completed(run.step), recipe.total), info=record.info
                )
                recipe.evaluate(run, run.step, finished)
                if save_every and run.step % save_every == 0 and not finished:
                    self.save(run.out / f"checkpoint-{run.step:06d}")
                    saved_at = run.step
                over = dist.rank == 0 and run.elapsed() / 60 > recipe.max_minutes
                if math.isfinite(recipe.max_minutes) and dist.any(over, run.device):
                    run.log({"event": "budget", "step": run.step, "elapsed_s": run.elapsed()})
                    break

    def interrupted(self, run: Run, saved_at: int) -> None:
        """Save the step reached (under FSDP every rank takes part) and raise the
        :class:`Interrupted` rank 0 words; the others end quietly once the save is done."""
        here = run.out / f"checkpoint-{run.step:06d}"
        if self.recipe.fsdp and run.step > 0 and run.step != saved_at:
            self.save(here)  # every rank: rank 0's interrupted_at finds it saved
        err = Interrupted(f"at step {run.step}")
        if self.metrics is not None:
            err = interrupted_at(
                run.step, self.recipe.where(run.step), here, self.save, self.metrics
            )
        run.dist.barrier()
        raise err

    def save(self, path: Path, resumable: bool = True) -> Path:
        """A checkpoint, atomically: its weights (the recipe's :meth:`Recipe.write`) and, for
        one to resume from (``resumable``), the trainer state and under FSDP the shards. Under
        FSDP every rank calls it (gathering the weights is a collective); else rank 0 alone
        writes."""
        recipe, run = self.recipe, self.run_
        dist, fsdp = run.dist, recipe.fsdp
        state: dict[str, Any] = {
            "step": run.step,
            **recipe.state_dict(),
            "rng": rng_state(),
            "metrics_bytes": self.metrics.size if self.metrics is not None else 0,
            "elapsed_s": run.elapsed(),
            "world_size": dist.world,
        }
        weights = full_state_dict(recipe.model, fsdp)  # a collective under FSDP
        sharded = fsdp and resumable
        if sharded:
            tmp = path.with_name(f".{path.name}.tmp")
            if dist.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            dist.barrier()
            save_sharded(tmp, recipe.model, recipe.optimizer)
        elif resumable:
            state["optimizer"] = recipe.optimizer.state_dict()
        if dist.rank == 0:
            with building_dir(path, keep=sharded) as directory:  # the shards are in it
                recipe.write(directory, weights)
                if resumable:
                    torch.save(state, directory / STATE)
        if fsdp:
            dist.barrier()
        return path


def _kept_log(state: dict[str, Any], metrics: Path) -> int:
    """The bytes of ``metrics.jsonl`` a run resumed from ``state`` keeps: the size its checkpoint
    noted, or, for a checkpoint written before checkpoints noted it, the records up to its
    step."""
    if not state or "metrics_bytes" in state:
        return int(state.get("metrics_bytes", 0))
    lines = metrics.read_text().splitlines(keepends=True) if metrics.is_file() else []
    return sum(len(line.encode()) for line in lines if json.loads(line)["step"] <= state["step"])
