"""``brisk experiment``: the ablations of :mod:`brisk.experiments`, one subcommand each
(proposal, drafter, corrector), every one run by :func:`run_experiment`.

An experiment is imported when it runs, so that ``brisk --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brisk._hf import quiet_transformers
from brisk._interrupt import exits_on_interrupt
from brisk.cli._common import add_mask_argument, add_placement_arguments, with_overrides

__all__ = ["EXPERIMENTS", "Experiment", "register", "run_experiment"]

# (the experiment's config class, its runner: runner(cfg, show_progress=...) → its summary)
Loaded = tuple[Any, Callable[..., Any]]


@dataclass(frozen=True)
class Experiment:
    """One ``brisk experiment`` subcommand: its name and help, what it runs (``load``, imported
    when it runs), whether it takes ``--device`` and ``--dtype`` (checked before any job
    starts), and the line it ends with, saying where the results are (``done(cfg, summary)``)."""

    name: str
    help: str
    load: Callable[[], Loaded]
    placement: bool
    done: Callable[[Any, Any], str]


def _proposal() -> Loaded:
    from brisk.experiments.proposal import run_experiment
    from brisk.experiments.proposal_config import ExperimentConfig

    return ExperimentConfig, run_experiment


def _drafter() -> Loaded:
    from brisk.experiments.drafter import run_drafter_experiment
    from brisk.experiments.drafter_config import DrafterExperimentConfig

    return DrafterExperimentConfig, run_drafter_experiment


def _corrector() -> Loaded:
    from brisk.experiments.corrector import run_corrector_experiment
    from brisk.experiments.corrector_config import CorrectorExperimentConfig

    return CorrectorExperimentConfig, run_corrector_experiment


def _best_arm(cfg: Any, summary: Any) -> str:
    return f"best arm by whole-run TPF: {summary['best_arm']}; summary in {cfg.out_dir}"


def _summary_file(cfg: Any, summary: Any) -> str:
    return f"summary in {cfg.out_dir}/summary.md"


EXPERIMENTS = (
    Experiment(
        "proposal",
        "the proposal-training ablation: arms × seeds, table, plots, report",
        _proposal,
        placement=True,
        done=_best_arm,
    ),
    Experiment(
        "drafter",
        "drafter weightings on one AR target: arms × seeds, TPF, tok/s vs AR",
        _drafter,
        placement=False,
        done=_summary_file,
    ),
    Experiment(
        "corrector",
        "the corrector ablation: head off vs heads, seeds, table, diagnostics",
        _corrector,
        placement=True,
        done=_summary_file,
    ),
)


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("experiment", help="reproducible ablations across seeds")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for experiment in EXPERIMENTS:
        x = commands.add_parser(experiment.name, help=experiment.help)
        x.add_argument("--config", type=Path, required=True, help="TOML experiment config")
        x.add_argument("--out", type=str, default=None, help="output directory (overrides out_dir)")
        x.add_argument("--workers", type=int, default=None, help="parallel jobs (1 thread each)")
        x.add_argument("--no-progress", action="store_true", help="quiet")
        if experiment.placement:
            add_placement_arguments(x)
        add_mask_argument(x)
        x.set_defaults(run=run_experiment, experiment=experiment)


@exits_on_interrupt
def run_experiment(args: argparse.Namespace) -> int:
    """Read ``--config`` into the experiment's config, apply the flags, run it and say where
    its results are. A bad config or flag is a ValueError naming the flag (one line, exit 2);
    an interruption ends in one line, exit 130."""
    experiment: Experiment = args.experiment
    config_class, runner = experiment.load()
    try:
        cfg = config_class.load(args.config)
    except ValueError as err:
        raise ValueError(f"--config: {err}") from None
    changes: dict[str, object] = {"out_dir": args.out, "workers": args.workers}
    if experiment.placement:
        changes |= {"device": args.device, "dtype": args.dtype}
    changes["mask_token_id"] = args.mask_token_id
    cfg = with_overrides(cfg, changes, {"out_dir": "out"})
    if experiment.placement:
        from brisk.runtime.loader import placement

        placement(cfg.device, cfg.dtype)  # checked (and said) before any job starts
    quiet_transformers()
    summary = runner(cfg, show_progress=not args.no_progress)
    print(experiment.done(cfg, summary))
    return 0
