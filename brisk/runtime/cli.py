"""``brisk train``: train the tiny base model and evaluate a checkpoint.

Heavy modules (torch models, transformers) are imported inside the run functions so that
``brisk --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from brisk._cli import comma_separated


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("train", help="train and evaluate runtime models")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = commands.add_parser("base", help="train the tiny base model with the I-DLM objective")
    b.add_argument("--config", type=Path, required=True, help="TOML or JSON training config")
    b.add_argument("--out", type=str, default=None, help="output directory (overrides out_dir)")
    b.add_argument("--steps", type=int, default=None, help="number of steps (overrides steps)")
    b.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    b.set_defaults(run=run_base)

    e = commands.add_parser("eval", help="answer accuracy and MASK-stream accuracy of a checkpoint")
    e.add_argument("--checkpoint", type=Path, required=True, help="save_pretrained directory")
    e.add_argument("--problems", type=int, default=200, help="held-out problems to decode")
    e.add_argument(
        "--strides",
        type=comma_separated(int, "integers"),
        default=(4, 8),
        help="strides N, e.g. 4,8",
    )
    e.add_argument("--seed", type=int, default=None, help="test-split seed (default: the run's)")
    e.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    e.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    e.set_defaults(run=run_eval)


def run_base(args: argparse.Namespace) -> int:
    from brisk.runtime.train.config import BaseTrainConfig

    try:
        cfg = BaseTrainConfig.load(args.config)
    except ValueError as err:
        raise ValueError(f"--config: {err}") from None
    if args.out is not None:
        cfg = cfg.replace(out_dir=args.out)
    if args.steps is not None:
        if args.steps < 1:
            raise ValueError(f"--steps: must be ≥ 1, got {args.steps}")
        cfg = cfg.replace(steps=args.steps)
    from brisk.runtime.train.base import train_base

    result = train_base(cfg, show_progress=not args.no_progress)
    print(f"trained in {result.wall_s / 60:.2f} min; checkpoint {result.checkpoint}")
    if result.report is not None:
        _print_report(result.report)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    import torch

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.tiny.task import TaskConfig, make_split
    from brisk.runtime.train.config import BaseTrainConfig
    from brisk.runtime.train.evaluate import evaluate

    for flag, value in (("--problems", args.problems), ("--threads", args.threads)):
        if value < 1:
            raise ValueError(f"{flag}: must be an integer ≥ 1, got {value}")
    config_file = args.checkpoint / "train_config.json"
    if not config_file.exists():
        raise ValueError(f"--checkpoint: {args.checkpoint} has no train_config.json")
    try:
        cfg = BaseTrainConfig.load(config_file)
    except ValueError as err:
        raise ValueError(f"--checkpoint: {err}") from None
    torch.set_num_threads(args.threads)
    backbone = HFBackbone.from_pretrained(args.checkpoint)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    task: TaskConfig = cfg.task
    seed = cfg.eval_seed if args.seed is None else args.seed
    problems = make_split(task, "test", args.problems, seed)
    report = evaluate(backbone, tokenizer, problems, strides=args.strides)
    _print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0


def _print_report(report: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from brisk.runtime.train.evaluate import EvalReport

    assert isinstance(report, EvalReport)
    console = Console()
    console.print(
        f"answer accuracy (greedy, clean stream): [bold]{report.accuracy:.1%}[/] "
        f"on {report.n_problems} held-out problems"
    )
    for N, acc in report.proposal_accuracy.items():
        table = Table("position i", *(str(i + 1) for i in range(len(acc))), title=f"N = {N}")
        table.add_row("MASK argmax acc", *(f"{a:.3f}" for a in acc))
        console.print(table)
    for prompt, text in report.samples:
        console.print(f"[dim]{prompt!r} → {text!r}[/]")
