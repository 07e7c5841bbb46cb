"""``brisk train``: the tiny base model, self-generated data, proposal training, evaluation.

Heavy modules (torch models, transformers) are imported inside the run functions so that
``brisk --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisk._hf import quiet_transformers
from brisk._interrupt import exits_on_interrupt
from brisk.cli._common import (
    add_config_arguments,
    add_mask_argument,
    add_placement_arguments,
    add_problem_decode_arguments,
    add_recipe_arguments,
    add_run_flags,
    comma_separated,
    config_from_args,
    config_overrides,
    run_problem_decode,
    run_recipe,
)
from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.drafter.config import DrafterTrainConfig
from brisk.runtime.train.pretrain.config import PretrainConfig
from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.selfgen import SelfGenOptions

if TYPE_CHECKING:
    from brisk.runtime.train.evaluate import EvalReport
    from brisk.runtime.train.harness import TrainResult


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("train", help="train and evaluate runtime models")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    b = commands.add_parser(
        "base", help="I-DLM training: the tiny preset, or a causal LM converted (--init)"
    )
    add_recipe_arguments(
        b,
        BaseTrainConfig,
        "TOML or JSON training config (default: the tiny preset); a [data] "
        "table names a file of prompt and response fields",
    )
    b.set_defaults(run=run_base)

    a = commands.add_parser(
        "ar", help="AR pre-training of a model preset on a corpus (before conversion)"
    )
    add_run_flags(a, "TOML or JSON config (default: the converted preset)")
    a.add_argument(
        "--export-corpus",
        type=Path,
        default=None,
        metavar="PATH",
        help="instead of training, write --examples examples of the config's broad "
        "corpus (drawn with --export-seed) as JSON Lines {prompt, response, "
        "answer, family}: the conversion data of `brisk train base`",
    )
    a.add_argument("--examples", type=int, default=20000, help="examples --export-corpus writes")
    a.add_argument(
        "--export-seed",
        type=int,
        default=1,
        help="corpus seed of --export-corpus (training draws with --seed)",
    )
    add_config_arguments(a, PretrainConfig, rename={"out_dir": "out"})
    a.set_defaults(run=run_ar)

    s = commands.add_parser(
        "selfgen", help="sample and grade responses with the deployed decoder (Parquet dataset)"
    )
    add_problem_decode_arguments(
        s, SelfGenOptions, checkpoint="the model that samples", out="dataset directory"
    )
    s.set_defaults(run=run_selfgen)

    p = commands.add_parser(
        "proposal", help="continued training with per-position proposal weights (BRISK)"
    )
    add_recipe_arguments(p, ProposalTrainConfig, "TOML or JSON proposal config")
    p.set_defaults(run=run_proposal)

    d = commands.add_parser(
        "drafter",
        help="a DFlash-shaped drafter for an AR target, on the target's regenerated responses",
    )
    add_recipe_arguments(d, DrafterTrainConfig, "TOML or JSON drafter config")
    d.set_defaults(run=run_drafter)

    from brisk.cli.corrector import register_train

    register_train(commands)

    h = commands.add_parser(
        "headroom", help="per-position CE of the MASK and causal streams on a model's own samples"
    )
    h.add_argument("--checkpoint", type=Path, required=True, help="save_pretrained directory")
    h.add_argument(
        "--samples",
        type=Path,
        required=True,
        help="`brisk decode --out` JSON Lines (graded; correct rows used)",
    )
    h.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="a second checkpoint measured on the same samples (e.g. a base trained "
        "to convergence): its MASK-stream CE is the achievable one",
    )
    h.add_argument("--stride", type=int, default=8, help="ISD stride N (M = N − 1)")
    h.add_argument("--temperature", type=float, default=1.0, help="temperature of β")
    h.add_argument("--top-k", type=int, default=16, help="Top-K of the drafter in β")
    h.add_argument("--all", action="store_true", help="use every sample, not only correct ones")
    h.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    h.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    add_placement_arguments(h)
    add_mask_argument(h)
    h.set_defaults(run=run_headroom)

    e = commands.add_parser("eval", help="answer accuracy and MASK-stream accuracy of a checkpoint")
    e.add_argument("--checkpoint", type=Path, required=True, help="save_pretrained directory")
    e.add_argument(
        "--problems",
        type=int,
        default=200,
        help="held-out problems (from a file: all of a smaller selection)",
    )
    e.add_argument(
        "--strides",
        type=comma_separated(int, "integers"),
        default=(4, 8),
        help="strides N, e.g. 4,8",
    )
    e.add_argument("--seed", type=int, default=None, help="test-split seed (default: the run's)")
    e.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    e.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    add_placement_arguments(e)
    add_mask_argument(e)
    from brisk.cli._common import add_task_arguments

    add_task_arguments(e, "the checkpoint's own world, its test split")
    e.set_defaults(run=run_eval)


@exits_on_interrupt
def run_base(args: argparse.Namespace) -> int:
    from brisk.runtime.train.base.recipe import BaseRecipe

    return run_recipe(args, BaseTrainConfig, BaseRecipe, _print_trained)


@exits_on_interrupt
def run_ar(args: argparse.Namespace) -> int:
    if args.export_corpus is not None:
        return _export_corpus(args)
    from brisk.runtime.train.pretrain.recipe import PretrainRecipe

    return run_recipe(args, PretrainConfig, PretrainRecipe, _print_trained)


def _print_trained(result: TrainResult[EvalReport | None]) -> None:
    """A base or AR run's summary: its time, its checkpoint and its held-out report."""
    print(f"trained in {result.wall_s / 60:.2f} min; checkpoint {result.checkpoint}")
    if result.outcome is not None:
        _print_report(result.outcome)


def _export_corpus(args: argparse.Namespace) -> int:
    """``brisk train ar --export-corpus FILE``: the broad corpus's examples, not a run."""
    from brisk.worlds.arithmetic.broad import export_corpus

    overrides = config_overrides(args, PretrainConfig)
    cfg = config_from_args(PretrainConfig, args.config, overrides, {"out_dir": "out"})
    if args.examples < 1:
        raise ValueError(f"--examples: must be an integer ≥ 1, got {args.examples}")
    if args.export_corpus.is_dir():
        raise ValueError(f"--export-corpus: {args.export_corpus} is a directory")
    if cfg.corpus.name != "broad":
        raise ValueError(f"--export-corpus: writes the broad corpus, not {cfg.corpus.name!r}")
    export_corpus(cfg.corpus.settings, args.export_corpus, args.examples, args.export_seed)
    print(f"wrote {args.examples} examples to {args.export_corpus}")
    return 0


@exits_on_interrupt
def run_selfgen(args: argparse.Namespace) -> int:
    from brisk.runtime.train.selfgen import generate_dataset

    result = run_problem_decode(SelfGenOptions, args, generate_dataset)
    print(
        f"{result.rows} responses ({result.correct / max(result.rows, 1):.1%} correct) in "
        f"{result.out}; {result.parts_written} parts written, {result.parts_skipped} resumed"
    )
    if result.grader_errors:
        print(
            f"the grader raised on {result.grader_errors} responses (counted wrong); first: "
            f"{result.first_grader_error}"
        )
    return 0


def _check_init(cfg: ProposalTrainConfig) -> None:
    if not cfg.init:
        raise ValueError("--init: proposal training needs a checkpoint to start from")
    if not (Path(cfg.init) / "config.json").is_file():
        raise ValueError(f"--init: {cfg.init} is not a checkpoint (no config.json)")


@exits_on_interrupt
def run_proposal(args: argparse.Namespace) -> int:
    from brisk.runtime.train.proposal.recipe import ProposalRecipe

    return run_recipe(args, ProposalTrainConfig, ProposalRecipe, _print_proposal, _check_init)


def _print_proposal(result: TrainResult[int]) -> None:
    print(
        f"trained {result.steps} steps on {result.outcome:,} tokens in "
        f"{result.wall_s / 60:.2f} min; checkpoint {result.checkpoint}"
    )


def _check_target(cfg: DrafterTrainConfig) -> None:
    if not cfg.target:
        raise ValueError("--target: drafter training needs the AR target checkpoint")


@exits_on_interrupt
def run_drafter(args: argparse.Namespace) -> int:
    from brisk.runtime.train.drafter.recipe import DrafterRecipe

    return run_recipe(args, DrafterTrainConfig, DrafterRecipe, _print_drafter, _check_target)


def _print_drafter(result: TrainResult[dict[str, Any] | None]) -> None:
    print(f"trained in {result.wall_s:.1f} s; drafter {result.checkpoint}")
    if result.outcome is not None:
        e = result.outcome
        M = DrafterTrainConfig.load(result.checkpoint / "train_config.json").M
        print(
            f"greedy speculative decoding of {e['problems']} held-out prompts: "
            f"TPF {e['tpf']:.3f} (tokens per target forward), E[L] {e['mean_accept']:.3f} "
            f"of {M}, draft forward {e['draft_cost']:.2f}× a verify forward"
        )


def run_eval(args: argparse.Namespace) -> int:
    import torch

    from brisk.cli._common import task_from_args
    from brisk.runtime.loader import load_model
    from brisk.runtime.tasks.spec import task_flag_errors
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.runtime.train.evaluate import evaluate

    for flag, value in (("--problems", args.problems), ("--threads", args.threads)):
        if value < 1:
            raise ValueError(f"{flag}: must be an integer ≥ 1, got {value}")
    if not (args.checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint: {args.checkpoint} is not a checkpoint (no config.json)")
    spec = task_from_args(args)
    seed = args.seed
    config_file = args.checkpoint / "train_config.json"
    if seed is None and spec.is_default and config_file.is_file():
        try:
            seed = BaseTrainConfig.load(config_file).eval_seed  # the run's own held-out draw
        except ValueError as err:
            raise ValueError(f"--checkpoint: {err}") from None
    torch.set_num_threads(args.threads)
    loaded = load_model(
        args.checkpoint,
        device=args.device,
        dtype=args.dtype,
        mask_token_id=args.mask_token_id,
        where="--checkpoint",
    )
    with task_flag_errors():
        task = spec.resolve(
            n=args.problems,
            seed=1 if seed is None else seed,
            split="test",
            checkpoint=args.checkpoint,
        )
        problems = task.problems(loaded.tokenizer)
    if not problems:
        raise ValueError("--task: the selection holds no problems")
    report = evaluate(loaded.backbone, loaded.tokenizer, problems, strides=args.strides, task=task)
    _print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0


def run_headroom(args: argparse.Namespace) -> int:
    import torch

    from brisk.runtime.loader import load_model
    from brisk.runtime.train.headroom import measure_headroom, read_samples

    if args.stride < 2:
        raise ValueError(f"--stride: need an integer N ≥ 2, got {args.stride}")
    if args.threads < 1:
        raise ValueError(f"--threads: must be an integer ≥ 1, got {args.threads}")
    names = {"--checkpoint": args.checkpoint, "--reference": args.reference}
    checkpoints = {flag: path for flag, path in names.items() if path is not None}
    for flag, path in checkpoints.items():
        if not (path / "config.json").is_file():
            raise ValueError(f"{flag}: {path} is not a checkpoint (no config.json)")
    if not args.samples.is_file():
        raise ValueError(f"--samples: no file {args.samples}")
    try:
        samples = read_samples(args.samples, correct_only=not args.all)
    except ValueError as err:
        raise ValueError(f"--{err}") from None
    torch.set_num_threads(args.threads)
    quiet_transformers()
    results = {}
    for flag, path in checkpoints.items():
        loaded = load_model(
            path, device=args.device, dtype=args.dtype, mask_token_id=args.mask_token_id, where=flag
        )
        room = measure_headroom(
            loaded.backbone, loaded.tokenizer, samples, args.stride, args.temperature, args.top_k
        )
        results[str(path)] = room.to_dict()
        _print_headroom(str(path), room)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _print_headroom(name: str, room: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from brisk.runtime.train.headroom import Headroom

    assert isinstance(room, Headroom)
    positions = [str(i + 1) for i in range(room.stride - 1)]
    table = Table(
        "position i", *positions, title=f"{name}: {room.n_samples} samples, N = {room.stride}"
    )
    for label, values in (
        ("CE MASK stream", room.ce_mask),
        ("CE causal stream", room.ce_causal),
        ("gap", room.gap),
        ("β (acceptance)", room.beta),
    ):
        table.add_row(label, *(f"{v:.3f}" for v in values))
    console = Console()
    console.print(table)
    console.print(
        f"mean CE: MASK {sum(room.ce_mask) / len(room.ce_mask):.3f}, causal "
        f"{sum(room.ce_causal) / len(room.ce_causal):.3f}; TPF predicted at β (complete "
        f"cycles): {room.predicted_tpf:.3f}"
    )


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
    if report.grader_errors:
        console.print(
            f"[yellow]the grader raised on {report.grader_errors} answers (counted wrong), "
            f"first: {report.first_grader_error}[/]"
        )
    for N, acc in report.proposal_accuracy.items():
        table = Table("position i", *(str(i + 1) for i in range(len(acc))), title=f"N = {N}")
        table.add_row("MASK argmax acc", *(f"{a:.3f}" for a in acc))
        console.print(table)
    for prompt, text in report.samples:
        console.print(f"[dim]{prompt!r} → {text!r}[/]")
