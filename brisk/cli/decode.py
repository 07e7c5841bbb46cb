"""``brisk decode``: ISD decoding of a prompt file, with statistics tied back to the theory;
with ``--drafter DIR``, speculative decoding: a DFlash drafter proposes and ``--model``, an AR
target, verifies (:mod:`brisk.runtime.drafter`).

Prompts come as JSON Lines, one object per request: ``{"prompt": str, "answer": ...,
"grader": str}`` (answer and grader optional; with an answer the output is graded by the row's
grader, else ``--grader``, else normalized answer matching, ``gsm8k``), or as a plain text file
with one prompt per line. ``brisk decode problems`` writes a task's problems in that format:
by default the checkpoint's own world's held-out ones, or any task (``--task FILE --fields …
--format chat --grader math``), rendered for the checkpoint's tokenizer.

The work is :mod:`brisk.runtime.decoding`'s (loading, decoding, grading, the partial file, the
summary figures) and :mod:`brisk.runtime.prompts`' (the prompt and answer files); this module
parses the flags, one per field of :class:`~brisk.runtime.decode_options.ISDOptions` for the
decode's options, names the flag of an option or argument the runtime refuses, and prints. Every
argument is checked before the model loads; bad input ends as one line naming the flag (and
file and line) with exit code 2. Every row holds the prompt's and the output's token ids
(``prompt_ids``, ``output_ids``) and its ``decoder``.

With ``--drafter`` the block is the drafter's (``--stride`` is refused), so is the MASK id
(``--mask-token-id`` is refused: the target has no MASK token and reads none), the loop runs in
float32 (``--dtype`` other than float32 is refused), one request at a time (``--batch-size`` has
no say), with greedy drafts at T = 0 and Top-K draws at T > 0 (``--top-k``); ``--corrector``
drafts over the drafter's Top-K; ``--shadow`` and ``--score-blocks`` (ISD's diagnostics) are
refused (:func:`~brisk.runtime.decoding.prepare_decode` refuses what it can tell from the
values; a flag given is this module's to refuse). ``--out`` is written atomically in prompt
order when decoding ends; meanwhile each finished completion is appended to ``.<name>.partial``
beside it, so a run killed outright keeps them. Ctrl-C stops decoding, closes the block log (its
parts are written atomically, so every part on disk stays valid), writes the completions
finished so far to ``--out``, prints one line and exits with 130; SIGTERM does the same, and a
second signal cannot cut the saving short (:mod:`brisk._interrupt`).

torch, transformers and the runtime are imported inside the run functions, so ``brisk --help``
stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from brisk._interrupt import INTERRUPTED, exits_on_interrupt, stop_signals
from brisk.cli._common import (
    add_config_arguments,
    add_placement_arguments,
    add_problem_file_arguments,
    flag_errors,
    with_overrides,
)
from brisk.runtime.decode_options import ISDOptions

# What the runtime names in its errors and brisk decode has a flag for: the options' fields and
# prepare_decode's arguments, each the flag of its name (``log_blocks`` → ``--log-blocks``).
_NAMED = {f.name for f in dataclasses.fields(ISDOptions)} | {
    "prompts",
    "corrector",
    "drafter",
    "plain",
    "log_blocks",
    "dtype",
    "mask_token_id",
}


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser(
        "decode", help="ISD decoding with exact verification (--drafter: speculative decoding)"
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="checkpoint directory (save_pretrained) or a GGUF file (converted once, cached); "
        "the AR target with --drafter",
    )
    parser.add_argument("--prompts", type=Path, help="JSON Lines {prompt, answer?} or text lines")
    parser.add_argument("--corrector", type=Path, default=None, help="corrector directory")
    parser.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help="a DFlash drafter directory: speculative decoding, --model the AR target that "
        "verifies (its block is the stride, its config the MASK id; float32, one request at a "
        "time)",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="plain autoregressive decoding of --model (one token per forward, one request at "
        "a time, no MASK id): the baseline of brisk bench speed",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="ISD requests per batch")
    parser.add_argument("--seed", type=int, default=0, help="request r uses seed + r")
    parser.add_argument("--samples", type=int, default=1, help="decode each prompt this often")
    parser.add_argument("--log-blocks", type=Path, default=None, help="block-log directory")
    parser.add_argument("--out", type=Path, default=None, help="write completions (JSON Lines)")
    add_placement_arguments(parser)
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run model code shipped with the checkpoint (I-DLM's SDAR models)",
    )
    parser.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="MASK id (default: the tokenizer's mask token, else config.mask_token_id)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--grader",
        default="",
        help="grader of rows with an answer and no grader of their own "
        "(default: gsm8k, normalized answer matching)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (shown on a terminal)"
    )
    isd = parser.add_argument_group("ISD options (brisk.runtime.isd.ISDOptions)")
    add_config_arguments(
        isd, ISDOptions, exclude=("eos_token_id",), dest_prefix="isd_", negatable=False
    )
    parser.set_defaults(run=run_decode)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("problems", help="write a task's problems as a prompt file")
    add_problem_file_arguments(
        p,
        checkpoint_help="the model (its tokenizer renders the prompts; its world is the default "
        "task)",
        checkpoint_required=True,
        seed_default=None,
        seed_help="which problems (default: the checkpoint's held-out draw)",
    )
    p.set_defaults(run=run_problems)


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise ValueError(f"{flag}: must be an integer ≥ 1, got {value}")


def _check_drafter_flags(args: argparse.Namespace) -> None:
    """``--drafter`` names a directory, and ``--stride`` is not given beside it (the block size
    is the drafter's; the values that mean nothing for a drafter, prepare_decode refuses)."""
    if not args.drafter.is_dir():
        raise ValueError(f"--drafter: {args.drafter} is not a drafter directory")
    if args.isd_stride is not None:
        raise ValueError("--stride: not with --drafter (the block size is the drafter's)")


def run_problems(args: argparse.Namespace) -> int:
    from brisk.cli._common import task_from_args
    from brisk.runtime.loader import load_tokenizer
    from brisk.runtime.prompts import check_output_file, write_jsonl
    from brisk.runtime.tasks.spec import task_flag_errors
    from brisk.runtime.train.base.config import BaseTrainConfig

    _positive(args.n, "--n")
    if not (args.checkpoint / "config.json").is_file():
        raise ValueError(f"--checkpoint: {args.checkpoint} is not a checkpoint (no config.json)")
    check_output_file(args.out, "--out")
    spec = task_from_args(args)
    split = spec.split or "test"
    seed = args.seed
    config_file = args.checkpoint / "train_config.json"
    if seed is None and not spec.path and config_file.is_file():
        try:
            cfg = BaseTrainConfig.load(config_file)
        except ValueError as err:
            raise ValueError(f"--checkpoint: {err}") from None
        seed = cfg.eval_seed if split == "test" else cfg.seed
    with task_flag_errors():
        task = spec.resolve(n=args.n, seed=seed or 0, split=split, checkpoint=args.checkpoint)
        tokenizer = load_tokenizer(args.checkpoint, where="--checkpoint")
        problems = task.problems(tokenizer)
    grader = task.describe().get("grader")
    rows = [
        {"id": p.id, "prompt": p.prompt, "answer": p.answer, "grader": grader} for p in problems
    ]
    write_jsonl(args.out, [{k: v for k, v in r.items() if v is not None} for r in rows])
    print(f"wrote {len(problems)} problems to {args.out}")
    return 0


def _options(args: argparse.Namespace) -> ISDOptions:
    """The decode's options from the flags, and everything else that can be checked without
    the model."""
    from brisk.cli._common import config_overrides
    from brisk.runtime.prompts import check_output_file
    from brisk.runtime.tasks.graders import resolve_grader

    if args.grader:
        try:
            resolve_grader(args.grader)
        except ValueError as err:  # "grader: …"
            raise ValueError(f"--{err}") from None
    if args.model is None:
        raise ValueError("--model: required (a checkpoint directory)")
    if not (args.model.is_dir() or args.model.is_file()):
        raise ValueError(f"--model: {args.model} is not a checkpoint directory or a GGUF file")
    if args.prompts is None:
        raise ValueError("--prompts: required (brisk decode problems writes a prompt file)")
    _positive(args.samples, "--samples")
    _positive(args.batch_size, "--batch-size")
    if args.threads is not None:
        _positive(args.threads, "--threads")
    options = with_overrides(ISDOptions(), config_overrides(args, ISDOptions, "isd_"))
    if args.corrector is not None and not args.corrector.is_dir():
        raise ValueError(f"--corrector: {args.corrector} is not a directory")
    if args.drafter is not None:
        _check_drafter_flags(args)
    if args.plain:
        refused = (("--stride", args.isd_stride), ("--mask-token-id", args.mask_token_id))
        for flag, value in refused:
            if value is not None:
                raise ValueError(f"{flag}: not with --plain (plain decoding has no MASK slots)")
    if args.out is not None:
        check_output_file(args.out, "--out")
    log = args.log_blocks
    if log is not None and log.exists() and (not log.is_dir() or any(log.iterdir())):
        raise ValueError(f"--log-blocks: {log} exists and is not an empty directory")
    return options


@exits_on_interrupt
def run_decode(args: argparse.Namespace) -> int:
    options = _options(args)
    import torch

    from brisk.runtime.decoding import decode_requests, prepare_decode
    from brisk.runtime.prompts import read_prompt_lines

    with flag_errors(_NAMED):
        lines = read_prompt_lines(args.prompts)
    requests = [{**r, "sample": k} for _, r in lines for k in range(args.samples)]
    labels = [f"{args.prompts} line {n}" for n, _ in lines for _ in range(args.samples)]
    with stop_signals() as stop:
        try:
            with stop.abortable(), flag_errors(_NAMED):  # loading: nothing to keep
                if args.threads:
                    torch.set_num_threads(args.threads)
                job = prepare_decode(
                    args.model,
                    requests,
                    options,
                    corrector=args.corrector,
                    log_blocks=args.log_blocks,
                    budget_given=args.isd_max_new_tokens is not None,
                    device=args.device,
                    dtype=args.dtype,
                    mask_token_id=args.mask_token_id,
                    trust_remote_code=args.trust_remote_code,
                    labels=labels,
                    drafter=args.drafter,
                    plain=args.plain,
                )
        except KeyboardInterrupt:
            print(
                f"brisk: interrupted before decoding started (0/{len(requests)} requests); "
                "nothing written",
                file=sys.stderr,
            )
            return INTERRUPTED
        note = job.fit.note("--max-new-tokens")
        if note is not None:
            print(f"brisk: {note}", file=sys.stderr)
        progress = _progress(len(requests), show=not args.no_progress and sys.stderr.isatty())
        try:
            with progress:
                task = progress.add_task("decoding", total=len(requests))
                decoded = decode_requests(
                    job,
                    seed=args.seed,
                    batch_size=args.batch_size,
                    grader=args.grader,
                    out=args.out,
                    on_row=lambda _: progress.advance(task),
                    stop=stop,
                )
        except Exception:
            # A failed run (a full disk) leaves no block log of its own: an incomplete one would
            # read as a log without its request table, and would refuse the rerun's --log-blocks.
            if args.log_blocks is not None:
                shutil.rmtree(args.log_blocks, ignore_errors=True)
            raise
    rows = decoded.rows
    if decoded.result is None:
        saved = [f"{len(rows)} completions to {args.out}"] if args.out is not None and rows else []
        if job.logger is not None:
            saved.append(f"{job.logger.rows_written} blocks to {job.logger.path}")
        what = f"wrote {' and '.join(saved)}" if saved else "nothing written"
        print(
            f"brisk: interrupted after {len(rows)}/{len(requests)} requests; {what}",
            file=sys.stderr,
        )
        return INTERRUPTED
    _print_summary(decoded.result, rows, job)
    return 0


def _progress(total: int, show: bool) -> Any:
    """A progress bar over requests with an ETA on stderr (a no-op unless ``show``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("decoding"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    console = Console(stderr=True, force_terminal=show or None)
    return Progress(*columns, console=console, transient=True, disable=not show)


def _print_summary(result: Any, rows: list[dict[str, Any]], job: Any) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from brisk.mechanism.runs import WHOLE_RUN
    from brisk.runtime.decoding import summarize

    console, options, figures = Console(), job.options, summarize(result, rows)
    if job.plain:
        seconds = sum(r.get("wall_s", 0.0) for r in rows)
        console.print(
            f"{len(rows)} requests, plain decoding, temperature {options.temperature:g}: "
            f"{result.generated} output tokens in {result.forwards} forwards, "
            f"{result.generated / seconds:.1f} tokens/s"
        )
        console.print(f"mean output length: [bold]{figures.mean_length:.1f}[/] tokens per request")
        if figures.graded:
            console.print(f"answer accuracy: [bold]{figures.accuracy:.1%}[/] of {figures.graded}")
        return
    profile = result.profile()
    rounds = profile.n_blocks
    speculative = job.drafter is not None
    decoder = (
        f"drafter {escape(str(job.drafter_path))} (block {options.stride})"
        if speculative
        else f"stride N = {options.stride}"
    )
    console.print(
        f"{len(rows)} requests, {decoder}, temperature {options.temperature:g}: "
        f"{result.generated} output tokens in {result.forwards} "
        f"{'target ' if speculative else ''}forwards "
        f"(the prefills, which commit each first token, and {rounds} verify rounds)"
    )
    if speculative:
        console.print(
            "draft cost ρ (the drafter's forward time ÷ the target's verify forward's): "
            f"{result.draft_cost:.3f}"
        )
    drafts = "the drafter drafts" if speculative else "the base drafts"
    if job.corrector is None:
        console.print(f"corrector: none ({drafts})")
    else:
        mode = (
            f"shadow: run beside the base for the block log, {drafts}"
            if options.shadow
            else "on: the head drafts" + (" over the drafter's Top-K" if speculative else "")
        )
        console.print(f"corrector: {escape(str(job.corrector_path))} ({mode})")
    console.print(
        f"mean output length: [bold]{figures.mean_length:.1f}[/] tokens per request "
        f"(EOS included); rejection: [bold]{figures.rejection:.2%}[/] of reached proposals"
    )
    for name, value, counts, what in result.run_tpf().lines():
        console.print(f"{name}: [bold]{value}[/] ({counts}; {what})")
        # the finite-horizon prediction runs ISD's state machine (cold starts), not a drafter's
        if name == WHOLE_RUN and result.forwards and rounds and not speculative:
            console.print(
                "  predicted from the in-output acceptance profile and the output lengths: "
                f"{result.predicted_run_tpf()}"
            )
    if figures.graded:
        errors = ""
        if figures.grader_errors:
            first = escape(str(figures.first_grader_error))
            errors = f"; {figures.grader_errors} grader errors, counted wrong (first: {first})"
        console.print(
            f"answer accuracy: [bold]{figures.accuracy:.1%}[/] of {figures.graded}{errors}"
        )
    low, high = profile.interval()
    table = Table(
        "position i",
        "reached",
        "accepted",
        "a_i",
        "95% interval",
        title="acceptance profile, every verify round",
    )
    for i, a in enumerate(profile.rates()):
        table.add_row(
            str(i + 1),
            str(profile.reached[i]),
            str(profile.accepted[i]),
            f"{a:.3f}",
            f"[{low[i]:.3f}, {high[i]:.3f}]",
        )
    console.print(table)
    if job.logger is not None:
        console.print(
            f"logged {job.logger.rows_written} blocks and {job.logger.requests_written} "
            f"requests to {job.logger.path}"
        )
