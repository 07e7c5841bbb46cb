"""Train the tiny base model with the I-DLM objective (``brisk train base --config FILE``).

One loop, read top to bottom: draw a batch of training problems, build ``[x_t | x_0]`` for the
curriculum's current stride, take an AdamW step, log, now and then evaluate and checkpoint.
Outputs under ``cfg.out_dir``: ``metrics.jsonl`` (one JSON object per log/eval event),
``checkpoint-<step>/`` and ``final/`` (``save_pretrained`` model + tokenizer +
``train_config.json``, each written to a temporary directory and renamed into place, so a reader
never sees half of one).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.tiny.model import build_model
from brisk.runtime.tiny.task import make_split, solutions
from brisk.runtime.tiny.tokenizer import char_tokenizer
from brisk.runtime.train.config import BaseTrainConfig
from brisk.runtime.train.evaluate import EvalReport, encode_problem, evaluate
from brisk.runtime.train.idlm import build_batch, idlm_forward, idlm_loss

__all__ = ["TrainResult", "cpu_settings", "replace_dir", "save_checkpoint", "train_base"]


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path  # the final save_pretrained directory
    history: list[dict[str, Any]]  # every record written to metrics.jsonl
    report: EvalReport | None  # held-out evaluation after training (None if disabled)
    wall_s: float  # training wall time, evaluation and final save excluded


def _lr(cfg: BaseTrainConfig, step: int) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(cfg.steps - cfg.warmup_steps, 1)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(t, 1.0)))


def save_checkpoint(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, cfg: BaseTrainConfig, path: Path
) -> Path:
    """Write model, tokenizer and config to ``path`` atomically (temp dir, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    return replace_dir(tmp, path)


def replace_dir(tmp: Path, path: Path) -> Path:
    """Move the finished directory ``tmp`` to ``path``, replacing what was there: a reader
    sees the old or the new directory, never half of one."""
    old = path.with_name(f".{path.name}.old")
    if path.exists():
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)
    return path


@contextmanager
def cpu_settings(threads: int) -> Iterator[None]:
    """Thread count and denormal flushing for the run, restored afterwards (tests share a
    process)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # denormal weights/activations can slow CPU matmuls many-fold
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)


def train_base(cfg: BaseTrainConfig, show_progress: bool = True) -> TrainResult:
    with cpu_settings(cfg.threads):
        return _train(cfg, show_progress)


def _train(cfg: BaseTrainConfig, show_progress: bool) -> TrainResult:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = (out / "metrics.jsonl").open("w")
    history: list[dict[str, Any]] = []

    def log(record: dict[str, Any]) -> None:
        history.append(record)
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()

    # Model, tokenizer and data: training problems stream from the train split; evaluation uses
    # distinct problems of the test split, which never shares a problem with training.
    tokenizer = char_tokenizer()
    model = build_model(cfg.model, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    train_stream = solutions(cfg.task, "train", cfg.seed)  # (problem, base-corpus response)
    n_eval = max(cfg.eval_problems, cfg.final_eval_problems)
    held_out = make_split(cfg.task, "test", n_eval, cfg.eval_seed) if n_eval else []
    log({"event": "start", "params": n_params, "config": cfg.to_dict()})

    # AdamW without decay on norms and biases (1-D tensors), the usual GPT recipe.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )

    def run_eval(step: int, n: int) -> EvalReport:
        report = evaluate(HFBackbone(model, tokenizer.mask_token_id), tokenizer, held_out[:n])
        model.train()
        log({"event": "eval", "step": step, "elapsed_s": time.monotonic() - t0, **report.to_dict()})
        return report

    progress = Progress(
        TextColumn("train base"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not show_progress,
    )  # fmt: skip
    t0 = time.monotonic()
    step = 0
    with progress:
        bar = progress.add_task("train", total=cfg.steps, info="")
        model.train()
        for step in range(cfg.steps):
            # Batch: the curriculum's stride fixes the block size M = N − 1 of the mask.
            N = cfg.stride_at(step)
            M = N - 1
            drawn = [next(train_stream) for _ in range(cfg.batch_size)]
            encoded = [encode_problem(p, tokenizer, response) for p, response in drawn]
            offset = rng.randrange(M) if cfg.random_block_offset else 0
            batch = build_batch(
                [s for s, _ in encoded], [n for _, n in encoded], M,
                tokenizer.mask_token_id, tokenizer.pad_token_id, offset=offset,
            )  # fmt: skip

            # Step: one forward over [x_t | x_0], loss = CE_noisy + α·CE_clean.
            for group in optimizer.param_groups:
                group["lr"] = _lr(cfg, step)
            noisy_logits, clean_logits = idlm_forward(model, batch)
            loss = idlm_loss(noisy_logits, clean_logits, batch, cfg.alpha)
            optimizer.zero_grad(set_to_none=True)
            loss.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()

            # Log: slot CE is averaged over rows, weighted by how many MASK slots each row had.
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                counts = loss.slot_count.sum(0)
                slot_ce = (loss.slot_ce * loss.slot_count).sum(0) / counts.clamp(min=1)
                log({
                    "event": "train", "step": step, "stride": N, "lr": _lr(cfg, step),
                    "loss": loss.loss.item(), "ce_noisy": loss.ce_noisy.item(),
                    "ce_clean": loss.ce_clean.item(), "alpha": loss.alpha,
                    "slot_ce": slot_ce.tolist(), "elapsed_s": time.monotonic() - t0,
                })  # fmt: skip
            progress.update(
                bar, advance=1, info=f"N={N} clean {loss.ce_clean.item():.3f} "
                f"noisy {loss.ce_noisy.item():.3f}",
            )  # fmt: skip

            # Evaluate and checkpoint now and then; stop early if the wall budget is spent.
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                run_eval(step + 1, cfg.eval_problems)
            if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
                save_checkpoint(model, tokenizer, cfg, out / f"checkpoint-{step + 1:06d}")
            if (time.monotonic() - t0) / 60 > cfg.max_minutes:
                log({"event": "budget", "step": step + 1, "elapsed_s": time.monotonic() - t0})
                break

    train_wall = time.monotonic() - t0
    final = save_checkpoint(model, tokenizer, cfg, out / "final")
    report = run_eval(step + 1, cfg.final_eval_problems) if cfg.final_eval_problems else None
    log({"event": "end", "train_wall_s": train_wall, "wall_s": time.monotonic() - t0})
    metrics.close()
    return TrainResult(final, history, report, train_wall)
