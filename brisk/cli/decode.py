"""``brisk decode``: ISD decoding of a prompt file, with statistics tied back to the theory.

Prompts come as JSON Lines, one object per request: ``{"prompt": str, "answer": ...,
"grader": str}`` (answer and grader optional; with an answer the output is graded by the row's
grader, else ``--grader``, else normalized answer matching, ``gsm8k``), or as a plain text file
with one prompt per line. ``brisk decode problems`` writes a task's problems in that format:
by default the checkpoint's own world's held-out ones, or any task (``--task FILE --fields …
--format chat --grader math``), rendered for the checkpoint's tokenizer. Prompts are encoded
and completions decoded by :mod:`brisk.runtime.prompts`, the same helpers the Python API offers.

Every argument is checked before the model loads; bad input ends as one line naming the
argument (and file and line) with exit code 2. ``--out`` is written atomically in prompt order
when decoding ends; meanwhile each finished completion is appended to ``.<name>.partial``
beside it, so a run killed outright keeps them. Ctrl-C stops decoding, closes the block log
(its parts are written atomically, so every part on disk stays valid), writes the completions
finished so far to ``--out``, prints one line and exits with 130; SIGTERM does the same, and a
second signal cannot cut the saving short (:mod:`brisk._interrupt`).

torch, transformers and the runtime are imported inside the run functions, so ``brisk --help``
stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from brisk._atomic import atomic_write_text
from brisk._interrupt import INTERRUPTED, StopSignals, exits_on_interrupt, stop_signals
from brisk.cli._common import add_placement_arguments

DEFAULT_MAX_NEW_TOKENS = 256


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("decode", help="ISD decoding with exact verification")
    parser.add_argument("--model", type=Path, help="checkpoint directory (save_pretrained)")
    parser.add_argument("--prompts", type=Path, help="JSON Lines {prompt, answer?} or text lines")
    parser.add_argument("--stride", type=int, default=4, help="ISD stride N (M = N − 1)")
    parser.add_argument("--corrector", type=Path, default=None, help="corrector directory")
    parser.add_argument("--shadow", action="store_true", help="run the corrector only for logs")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=16, help="candidates K without a corrector")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"token budget per request (default {DEFAULT_MAX_NEW_TOKENS}, or what fits the "
        "model's positions after the longest prompt)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="request r uses seed + r")
    parser.add_argument("--samples", type=int, default=1, help="decode each prompt this often")
    parser.add_argument("--log-blocks", type=Path, default=None, help="block-log directory")
    parser.add_argument(
        "--score-blocks",
        action="store_true",
        help="diagnostics: also log base/head whole-block log-likelihoods (one extra forward "
        "per verify round, not counted)",
    )
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
    parser.add_argument("--grader", default="",
                        help="grader of rows with an answer and no grader of their own "
                             "(default gsm8k: normalized answer matching)")  # fmt: skip
    parser.add_argument(
        "--no-progress", action="store_true", help="hide the progress bar (shown on a terminal)"
    )
    parser.set_defaults(run=run_decode)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("problems", help="write a task's problems as a prompt file")
    p.add_argument("--checkpoint", type=Path, required=True,
                   help="the model (its tokenizer renders the prompts; its world is the default "
                        "task)")  # fmt: skip
    p.add_argument("--n", type=int, default=200, help="problems (from a file: all of fewer)")
    p.add_argument("--seed", type=int, default=None,
                   help="which problems (default: the checkpoint's held-out draw)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    from brisk.cli._common import add_task_arguments

    add_task_arguments(p, "the checkpoint's own world, its test split")
    p.set_defaults(run=run_problems)


def read_prompts(path: Path) -> list[dict[str, Any]]:
    """Requests from ``path``; anything malformed is an error naming the file and line."""
    from brisk.runtime.tasks.sources import read_json_lines, read_lines

    if not path.exists():
        raise ValueError(f"--prompts: {path} does not exist")
    if not path.is_file():
        raise ValueError(f"--prompts: {path} is not a file")
    try:
        if path.suffix in {".jsonl", ".json"}:
            items = read_json_lines(path)
        else:
            items = [(number, {"prompt": line}) for number, line in read_lines(path)]
    except ValueError as err:
        raise ValueError(f"--prompts: {err}") from None
    from brisk.runtime.tasks.graders import resolve_grader

    for number, item in items:
        where = f"--prompts: {path} line {number}"
        if "prompt" not in item:
            raise ValueError(f'{where}: no "prompt" field (keys: {", ".join(item) or "none"})')
        if "grader" in item:
            try:
                resolve_grader(item["grader"])
            except ValueError as err:
                raise ValueError(f'{where}: "grader": {err}') from None
        if not isinstance(item["prompt"], str):
            raise ValueError(f'{where}: "prompt" must be a string, got {item["prompt"]!r}')
    if not items:
        raise ValueError(f"--prompts: {path} holds no prompts")
    return [item for _, item in items]


def check_output_file(path: Path, flag: str) -> None:
    """Fail before any work if ``path`` cannot be written as a file."""
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{flag}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{flag}: directory {parent} is not writable")


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise ValueError(f"{flag}: must be an integer ≥ 1, got {value}")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write all rows, atomically: readers see the old file or the whole new one."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


@contextmanager
def _argument(flag: str | None = None) -> Iterator[None]:
    """Name the command-line flag in errors of the runtime, which name its own argument
    (``path: …``): ``flag``, or the argument's name spelt as a flag (``top_k`` → ``--top-k``)."""
    try:
        yield
    except ValueError as err:
        head, sep, rest = str(err).partition(": ")
        if not (sep and head.isidentifier()):
            raise ValueError(f"{flag}: {err}" if flag else str(err)) from None
        raise ValueError(f"{flag or '--' + head.replace('_', '-')}: {rest}") from None


def run_problems(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from brisk.cli._common import task_from_args
    from brisk.runtime.tasks.spec import task_flag_errors
    from brisk.runtime.train.config import BaseTrainConfig

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
        tokenizer = AutoTokenizer.from_pretrained(args.checkpoint, local_files_only=True)
        problems = task.problems(tokenizer)
    grader = task.describe().get("grader")
    rows = [{"id": p.id, "prompt": p.prompt, "answer": p.answer, "grader": grader}
            for p in problems]  # fmt: skip
    _write_jsonl(args.out, [{k: v for k, v in r.items() if v is not None} for r in rows])
    print(f"wrote {len(problems)} problems to {args.out}")
    return 0


def _check_args(args: argparse.Namespace) -> None:
    """Everything that can be checked without the model."""
    if args.grader:
        from brisk.runtime.tasks.graders import resolve_grader

        with _argument("--grader"):
            resolve_grader(args.grader)
    if args.model is None:
        raise ValueError("--model: required (a checkpoint directory)")
    if not args.model.is_dir():
        raise ValueError(f"--model: {args.model} is not a checkpoint directory")
    if args.prompts is None:
        raise ValueError("--prompts: required (brisk decode problems writes a prompt file)")
    _positive(args.samples, "--samples")
    _positive(args.batch_size, "--batch-size")
    if args.threads is not None:
        _positive(args.threads, "--threads")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ValueError(f"--temperature: must be a finite number ≥ 0, got {args.temperature}")
    if args.top_k < 1:
        why = (
            " (0 does not mean 'no limit' here: drafts at T > 0 are drawn from q restricted to "
            "its Top-K, so pass the vocabulary size for untruncated drafts)"
        )
        raise ValueError(
            f"--top-k: need K ≥ 1 candidates per MASK position, got {args.top_k}"
            + (why if args.top_k == 0 else "")
        )
    if args.corrector is not None and not args.corrector.is_dir():
        raise ValueError(f"--corrector: {args.corrector} is not a directory")
    if args.shadow and args.corrector is None:
        raise ValueError("--shadow: needs --corrector (the head to run beside the base)")
    if args.out is not None:
        check_output_file(args.out, "--out")
    log = args.log_blocks
    if log is not None and log.exists() and (not log.is_dir() or any(log.iterdir())):
        raise ValueError(f"--log-blocks: {log} exists and is not an empty directory")


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """Tokenizer, backbone and corrector (or None) as the arguments ask
    (:func:`brisk.runtime.loader.load_model`: the one loader)."""
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.loader import load_model

    loaded = load_model(
        args.model, device=args.device, dtype=args.dtype, mask_token_id=args.mask_token_id,
        trust_remote_code=args.trust_remote_code,
    )  # fmt: skip
    corrector = None
    if args.corrector is not None:
        with _argument("--corrector"):
            corrector = Corrector.from_pretrained(
                args.corrector, backbone=loaded.backbone, device=loaded.placement.device
            )
    return loaded.tokenizer, loaded.backbone, corrector


def _check_fit(args: argparse.Namespace, options: Any, backbone: Any, corrector: Any,
               prompts: list[list[int]]) -> Any:  # fmt: skip
    """The stride and token budget against the model and the corrector, before decoding; the
    options with the default budget lowered to what fits the model's positions, if needed."""
    from brisk.runtime.loader import fit_budget

    if corrector is not None and corrector.config.M != options.M:
        N = corrector.config.M + 1
        raise ValueError(
            f"--stride: the corrector at {args.corrector} was trained for stride N = {N} "
            f"(M = {corrector.config.M}), got --stride {args.stride}"
        )
    return fit_budget(options, backbone.max_positions, prompts,
                      budget_given=args.max_new_tokens is not None)  # fmt: skip


@exits_on_interrupt
def run_decode(args: argparse.Namespace) -> int:
    _check_args(args)
    requests = [{**r, "sample": k} for r in read_prompts(args.prompts) for k in range(args.samples)]
    with stop_signals() as stop:
        try:
            with stop.abortable():  # loading: nothing to keep
                setup = _setup(args, requests)
        except KeyboardInterrupt:
            print(f"brisk: interrupted before decoding started (0/{len(requests)} requests); "
                  "nothing written", file=sys.stderr)  # fmt: skip
            return INTERRUPTED
        result, rows = _decode(args, requests, setup, stop)
    if result is None:
        saved = [f"{len(rows)} completions to {args.out}"] if args.out is not None and rows else []
        if setup.logger is not None:
            saved.append(f"{setup.logger.rows_written} blocks to {setup.logger.path}")
        what = f"wrote {' and '.join(saved)}" if saved else "nothing written"
        print(f"brisk: interrupted after {len(rows)}/{len(requests)} requests; {what}",
              file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    _print_summary(result, rows, setup, args)
    return 0


@dataclass(frozen=True)
class _Setup:
    options: Any  # ISDOptions
    tokenizer: Any
    backbone: Any
    corrector: Any
    prompts: list[list[int]]
    logger: Any  # BlockLogger | None


def _setup(args: argparse.Namespace, requests: list[dict[str, Any]]) -> _Setup:
    """Options, model, encoded prompts and block log, every check done before decoding."""
    import dataclasses

    import torch

    from brisk.runtime.blocklog import BlockLogger
    from brisk.runtime.isd import ISDOptions
    from brisk.runtime.prompts import encode_prompt

    with _argument():  # ISDOptions names its fields, which the flags spell with dashes
        options = ISDOptions(stride=args.stride, temperature=args.temperature,
                             max_new_tokens=_or(args.max_new_tokens, DEFAULT_MAX_NEW_TOKENS),
                             shadow=args.shadow, top_k=args.top_k,
                             score_blocks=args.score_blocks)  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer, backbone, corrector = _load(args)
    options = dataclasses.replace(options, eos_token_id=tokenizer.eos_token_id)
    prompts = [encode_prompt(tokenizer, r["prompt"]) for r in requests]
    options = _check_fit(args, options, backbone, corrector, prompts)
    K = corrector.config.K if corrector is not None else min(args.top_k, backbone.vocab_size)
    logger = None
    if args.log_blocks is not None:
        with _argument("--log-blocks"):
            logger = BlockLogger(args.log_blocks, options.M, K)
    return _Setup(options, tokenizer, backbone, corrector, prompts, logger)


def _decode(
    args: argparse.Namespace, requests: list[dict[str, Any]], setup: _Setup, stop: StopSignals
) -> tuple[Any, list[dict[str, Any]]]:
    """Decode and save; the result is None when a signal stopped decoding (it raises inside
    :meth:`~brisk._interrupt.StopSignals.abortable`; during the saving after it a signal is only
    recorded). Rows are the finished requests' completions in prompt order."""
    from brisk.runtime.isd import RequestOutput, decode
    from brisk.runtime.prompts import completion_text
    from brisk.runtime.tasks.graders import grade_all

    M, tokenizer = setup.options.M, setup.tokenizer
    done: dict[int, dict[str, Any]] = {}
    partial = _Partial(args.out) if args.out is not None else None
    progress = _progress(len(requests), show=not args.no_progress and sys.stderr.isatty())

    def on_finish(r: int, output: RequestOutput) -> None:
        req = requests[r]
        row = {
            "id": req.get("id", r),
            "sample": req["sample"],
            "prompt": req["prompt"],
            "completion": completion_text(tokenizer, output.tokens),
            "forwards": output.forwards,
            "tokens": len(output.tokens),
            "tpf": output.tpf,
            "accept_hist": output.histogram(M),
        }
        if "answer" in req:  # a grader that raises counts as wrong (and is reported)
            grader = req.get("grader") or args.grader or "gsm8k"
            graded = grade_all(grader, [row["completion"]], [req["answer"]], workers=1)
            row["correct"] = graded.correct[0] is True
            if graded.errors:
                row["grader_error"] = graded.first_error
        done[r] = row
        if partial is not None:
            partial.add(row)
        progress.advance(task)

    result = None
    try:
        with progress, stop.abortable():
            task = progress.add_task("decoding", total=len(requests))
            result = decode(
                setup.backbone, setup.prompts, setup.options, corrector=setup.corrector,
                seeds=[args.seed + i for i in range(len(requests))], logger=setup.logger,
                batch_size=args.batch_size, on_finish=on_finish,
            )  # fmt: skip
    except KeyboardInterrupt:
        pass  # save what finished
    finally:
        if setup.logger is not None:
            setup.logger.close()
        if partial is not None:
            partial.close()
    rows = [done[r] for r in sorted(done)]
    if args.out is not None and (result is not None or rows):
        _write_jsonl(args.out, rows)
    if partial is not None:
        partial.remove()
    return result, rows


class _Partial:
    """Finished completions appended to ``.<name>.partial`` beside ``--out``, in finish order."""

    def __init__(self, out: Path) -> None:
        self.path = out.with_name(f".{out.name}.partial")
        self.file: IO[str] | None = self.path.open("w")

    def add(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


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

    return Progress(
        TextColumn("decoding"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=Console(stderr=True, force_terminal=show or None), transient=True,
        disable=not show,
    )  # fmt: skip


def _rejection(profile: Any) -> float:
    """Rejected ÷ reached proposal positions, pooled over positions (the paper's Reject %)."""
    reached = int(profile.reached.sum())
    return (reached - int(profile.accepted.sum())) / reached if reached else math.nan


def _print_summary(result: Any, rows: list[dict[str, Any]], setup: _Setup, args: Any) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from brisk.mechanism.runs import WHOLE_RUN

    console, options = Console(), setup.options
    profile = result.profile()
    rounds = profile.n_blocks
    console.print(
        f"{len(rows)} requests, stride N = {options.stride}, temperature {options.temperature:g}: "
        f"{result.generated} output tokens in {result.forwards} forwards "
        f"(the prefills, which commit each first token, and {rounds} verify rounds)"
    )
    if setup.corrector is None:
        console.print("corrector: none (the base drafts)")
    else:
        mode = (
            "shadow: run beside the base for the block log, the base drafts"
            if options.shadow
            else "on: the head drafts"
        )
        console.print(f"corrector: {escape(str(args.corrector))} ({mode})")
    lengths = result.lengths
    console.print(
        f"mean output length: [bold]{sum(lengths) / len(lengths):.1f}[/] tokens per request "
        f"(EOS included); rejection: [bold]{_rejection(profile):.2%}[/] of reached proposals"
    )
    for name, value, counts, what in result.run_tpf().lines():
        console.print(f"{name}: [bold]{value}[/] ({counts}; {what})")
        if name == WHOLE_RUN and result.forwards and rounds:
            console.print(
                "  predicted from the in-output acceptance profile and the output lengths: "
                f"{result.predicted_run_tpf()}"
            )
    graded = [r["correct"] for r in rows if "correct" in r]
    if graded:
        console.print(f"answer accuracy: [bold]{sum(graded) / len(graded):.1%}[/] of {len(graded)}")
    low, high = profile.interval()
    table = Table("position i", "reached", "accepted", "a_i", "95% interval",
                  title="acceptance profile, every verify round")  # fmt: skip
    for i, a in enumerate(profile.rates()):
        table.add_row(str(i + 1), str(profile.reached[i]), str(profile.accepted[i]),
                      f"{a:.3f}", f"[{low[i]:.3f}, {high[i]:.3f}]")  # fmt: skip
    console.print(table)
    if setup.logger is not None:
        console.print(
            f"logged {setup.logger.rows_written} blocks and {setup.logger.requests_written} "
            f"requests to {setup.logger.path}"
        )
