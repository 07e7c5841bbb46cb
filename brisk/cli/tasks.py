"""``brisk tasks``: the registered tasks, and any task's problems written as a JSON Lines file.

``brisk tasks export`` writes ``{"id", "prompt", "answer", "response"?}`` rows, what a user's data
file looks like, so the generic path (``--task FILE``) can be checked against a registered
world, or a world's problems handed to other tools::

    brisk tasks export --checkpoint runs/tiny/base/final --split train --n 1000 --out a.jsonl
    brisk tasks export --task arithmetic --preset paper --n 200 --out paper_test.jsonl
"""

from __future__ import annotations

import argparse
import json

from brisk._atomic import atomic_write_text


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from brisk.cli._common import add_problem_file_arguments

    parser = layers.add_parser("tasks", help="registered tasks; export a task's problems")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ls = commands.add_parser("list", help="the registered tasks and the built-in graders")
    ls.set_defaults(run=run_list)
    x = commands.add_parser("export", help="write a task's problems as JSON Lines")
    add_problem_file_arguments(
        x,
        checkpoint_help="its world is the default task; its tokenizer renders chat",
        checkpoint_required=False,
        seed_default=0,
        seed_help="which problems",
        out_help="the JSON Lines file to write",
    )
    x.set_defaults(run=run_export)


def run_list(args: argparse.Namespace) -> int:
    from brisk.runtime.tasks import GRADERS, task_names

    print("tasks:   " + ", ".join(task_names()) + "  (or a data file: --task PATH)")
    print("graders: " + ", ".join(GRADERS) + "  (or module:function)")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from brisk.cli._common import task_from_args
    from brisk.runtime.tasks.spec import task_flag_errors

    if args.n < 1:
        raise ValueError(f"--n: must be an integer ≥ 1, got {args.n}")
    spec = task_from_args(args)
    if spec.is_default and args.checkpoint is None:
        raise ValueError("--task: name a task, or give --checkpoint to export its world")
    if args.out.exists() and args.out.is_dir():
        raise ValueError(f"--out: {args.out} is a directory")
    tokenizer = None
    if args.checkpoint is not None:
        from brisk.runtime.loader import load_tokenizer

        tokenizer = load_tokenizer(args.checkpoint, where="--checkpoint")
    with task_flag_errors():
        task = spec.resolve(
            n=args.n, seed=args.seed, split=spec.split or "test", checkpoint=args.checkpoint
        )
        problems = task.problems(tokenizer)
    rows = []
    for p in problems:
        row = {"id": p.id, "prompt": p.prompt, "answer": p.answer}
        if "response" in p.record:
            row["response"] = p.record["response"]
        rows.append(json.dumps(row))
    atomic_write_text(args.out, "".join(r + "\n" for r in rows))
    print(f"wrote {len(rows)} problems to {args.out}")
    return 0
