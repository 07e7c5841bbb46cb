"""``brisk decode``: ISD decoding of a prompt file, with statistics tied back to the theory.

Prompts come as JSON Lines, one object per request: ``{"prompt": str, "answer": ...}`` (the
answer is optional; with it the output is graded by normalized answer matching), or as a plain
text file with one prompt per line. ``brisk decode problems`` writes the tiny world's held-out
problems in that format.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = layers.add_parser("decode", help="ISD decoding with exact verification")
    parser.add_argument("--model", type=Path, help="checkpoint directory (save_pretrained)")
    parser.add_argument("--prompts", type=Path, help="JSON Lines {prompt, answer?} or text lines")
    parser.add_argument("--stride", type=int, default=4, help="ISD stride N (M = N − 1)")
    parser.add_argument("--corrector", type=Path, default=None, help="corrector directory")
    parser.add_argument("--shadow", action="store_true", help="run the corrector only for logs")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=16, help="candidates K without a corrector")
    parser.add_argument("--max-new-tokens", type=int, default=256)
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
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.set_defaults(run=run_decode)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("problems", help="write tiny-world problems as a prompt file")
    p.add_argument("--checkpoint", type=Path, required=True, help="a tiny base checkpoint")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--split", choices=("test", "train"), default="test")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(run=run_problems)


def read_prompts(path: Path) -> list[dict[str, Any]]:
    """Requests from ``path``; a malformed JSON line is an error naming the file and line."""
    if not path.is_file():
        raise ValueError(f"--prompts: {path} not found")
    requests = []
    lines = path.read_text().splitlines()
    as_json = path.suffix in {".jsonl", ".json"}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not as_json:
            requests.append({"prompt": line})
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"--prompts: {path} line {number}: {err.msg}") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"--prompts: {path} line {number}: expected an object with 'prompt'")
        requests.append(item)
    if not requests:
        raise ValueError(f"--prompts: {path} holds no prompts")
    return requests


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def run_problems(args: argparse.Namespace) -> int:
    from brisk.runtime.tiny.task import make_split
    from brisk.runtime.train.config import BaseTrainConfig

    config_file = args.checkpoint / "train_config.json"
    if not config_file.is_file():
        raise ValueError(f"--checkpoint: {args.checkpoint} has no train_config.json")
    cfg = BaseTrainConfig.load(config_file)
    seed = cfg.eval_seed if args.split == "test" else cfg.seed
    problems = make_split(cfg.task, args.split, args.n, seed)
    _write_jsonl(
        args.out,
        [{"id": i, "prompt": p.prompt, "answer": p.answer} for i, p in enumerate(problems)],
    )
    print(f"wrote {len(problems)} {args.split} problems to {args.out}")
    return 0


def run_decode(args: argparse.Namespace) -> int:
    if args.model is None or args.prompts is None:
        raise ValueError("--model and --prompts are required")
    import torch
    from transformers import AutoTokenizer

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.blocklog import BlockLogger
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.isd import ISDOptions, decode
    from brisk.runtime.tiny.grader import grade

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.samples < 1:
        raise ValueError(f"--samples: need a positive integer, got {args.samples}")
    requests = [{**r, "sample": k} for r in read_prompts(args.prompts) for k in range(args.samples)]
    backbone = HFBackbone.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    corrector = None
    if args.corrector is not None:
        corrector = Corrector.from_pretrained(args.corrector, backbone=backbone)
    options = ISDOptions(
        stride=args.stride,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        shadow=args.shadow,
        top_k=args.top_k,
        score_blocks=args.score_blocks,
    )
    prompts = [_encode(tokenizer, r["prompt"]) for r in requests]
    seeds = [args.seed + i for i in range(len(prompts))]
    K = corrector.config.K if corrector is not None else min(args.top_k, backbone.vocab_size)
    logger = BlockLogger(args.log_blocks, options.M, K) if args.log_blocks else None
    try:
        result = decode(backbone, prompts, options, corrector=corrector, seeds=seeds,
                        logger=logger, batch_size=args.batch_size)  # fmt: skip
    finally:
        if logger is not None:
            logger.close()
    rows = []
    for i, (req, out) in enumerate(zip(requests, result.requests, strict=True)):
        tokens = [t for t in out.tokens if t != tokenizer.eos_token_id]
        row = {
            "id": req.get("id", i),
            "sample": req["sample"],
            "prompt": req["prompt"],
            "completion": tokenizer.decode(tokens),
            "forwards": out.forwards,
            "tokens": out.committed,
            "tpf": out.tpf,
            "accept_hist": out.histogram(options.M),
        }
        if "answer" in req:
            row["correct"] = grade(row["completion"], req["answer"])
        rows.append(row)
    if args.out is not None:
        _write_jsonl(args.out, rows)
    _print_summary(result, rows, options, logger)
    return 0


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids


def _print_summary(result: Any, rows: list[dict[str, Any]], options: Any, logger: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from brisk.theory import CostModel

    console = Console()
    profile = result.profile()
    interval = result.cycle_profile().tpf_interval(CostModel.isd(options.M))
    rounds = profile.n_blocks
    console.print(
        f"{len(rows)} requests, stride N = {options.stride}, temperature {options.temperature:g}: "
        f"{result.committed} tokens in {result.forwards} forwards over {rounds} verify rounds"
    )
    console.print(
        f"TPF measured [bold]{result.tpf:.3f}[/] (complete cycles {result.cycle_tpf:.3f}); "
        f"theory at the measured profile {interval}"
    )
    graded = [r["correct"] for r in rows if "correct" in r]
    if graded:
        console.print(f"answer accuracy: [bold]{sum(graded) / len(graded):.1%}[/] of {len(graded)}")
    low, high = profile.interval()
    table = Table("position i", "reached", "accepted", "a_i", "95% interval")
    for i, a in enumerate(profile.rates()):
        table.add_row(str(i + 1), str(profile.reached[i]), str(profile.accepted[i]),
                      f"{a:.3f}", f"[{low[i]:.3f}, {high[i]:.3f}]")  # fmt: skip
    console.print(table)
    if logger is not None:
        console.print(f"logged {logger.rows_written} blocks to {logger.path}")
