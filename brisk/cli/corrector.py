"""``brisk train corrector [collect]``: the verifier-distilled head (issue: corrector
training); its ablation is ``brisk experiment corrector`` (:mod:`brisk.cli.experiment`). Heavy
modules are imported inside the run functions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from brisk._interrupt import exits_on_interrupt
from brisk.cli._common import (
    add_problem_decode_arguments,
    add_recipe_arguments,
    run_problem_decode,
)
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig

if TYPE_CHECKING:
    from brisk.runtime.train.corrector.recipe import CorrectorRecipe, HeadFit
    from brisk.runtime.train.harness import TrainResult

__all__ = ["register_train"]


def register_train(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = commands.add_parser(
        "corrector",
        help="train the verifier-distilled corrector on collected events ('collect' first)",
        description="Train the corrector (eq. 6 of the appendix) on an event store. "
        "'brisk train corrector collect' makes the store.",
    )
    add_recipe_arguments(c, CorrectorTrainConfig, "TOML or JSON corrector config")
    c.set_defaults(run=run_train)
    sub = c.add_subparsers(dest="action", metavar="ACTION")
    k = sub.add_parser(
        "collect", help="decode training problems head-off and store policy-reached events"
    )
    add_problem_decode_arguments(
        k,
        CollectOptions,
        checkpoint="the frozen backbone (with --drafter: the AR target)",
        out="event store directory (new)",
    )
    k.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help="a DFlash drafter of the AR target --checkpoint: collect the events of speculative "
        "decoding (--stride defaults to its block size)",
    )
    k.set_defaults(run=run_collect)


@exits_on_interrupt
def run_collect(args: argparse.Namespace) -> int:
    from brisk.runtime.train.corrector.events import collect_from_checkpoint

    if args.drafter is not None and args.cfg_stride is None:
        args.cfg_stride = _block_size(args.drafter)
    store = run_problem_decode(CollectOptions, args, collect_from_checkpoint, drafter=args.drafter)
    print(
        f"{len(store)} events from {store.meta['requests']} responses "
        f"({store.correct.mean():.1%} of events from correct ones), M = {store.M}, "
        f"K = {store.K}, H = {store.hidden_size} in {args.out}"
    )
    return 0


def _block_size(drafter: Path) -> int | None:
    """The drafter's block size from its config (None where it cannot be read: loading the
    drafter then says why)."""
    import json

    try:
        size = json.loads((drafter / "config.json").read_text()).get("block_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) else None


@exits_on_interrupt
def run_train(args: argparse.Namespace) -> int:
    from brisk.cli._common import run_recipe

    return run_recipe(args, CorrectorTrainConfig, _recipe, _print_trained)


def _print_trained(result: TrainResult[HeadFit]) -> None:
    fit = result.outcome
    print(
        f"trained {result.steps} steps on {fit.train_events:,} events in "
        f"{result.wall_s / 60:.2f} min; held-out loss {fit.val_loss_init:.4f} → "
        f"{fit.val_loss:.4f}; head {result.checkpoint}"
    )


def _recipe(cfg: CorrectorTrainConfig) -> CorrectorRecipe:
    """The corrector recipe on ``cfg.events``, whose faults name ``--events``."""
    from brisk.runtime.train.corrector.recipe import corrector_recipe
    from brisk.runtime.train.corrector.store import EventStore

    if not cfg.events:
        raise ValueError(
            "--events: corrector training needs an event store (train corrector collect makes one)"
        )
    try:
        store = EventStore.open(cfg.events)
    except ValueError as err:
        raise ValueError(f"--events: {err}") from None
    return corrector_recipe(cfg, store=store)
