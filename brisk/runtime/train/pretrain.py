"""AR pre-training of a model preset as an ordinary causal LM on a task's corpus (``brisk train ar
--config FILE``; by default the tiny model on the arithmetic world's broad corpus): the first
half of an I-DLM-style converted base (issue 23).

The second half is ``brisk train base --init <this run>/final`` on the same corpus with a short
budget (``configs/converted_base.toml``): the I-DLM conversion recipe, which leaves the MASK
stream behind the causal stream the way I-DLM-8B's lags its Qwen3 parent.

The objective is next-token cross-entropy over every token of ``[bos, prompt, response, eos]``
(prompt included: a pre-training corpus has no prompt/response roles),

    L = −(1/n) Σ_b Σ_{j < ℓ_b − 1} log p_θ(x_b[j + 1] | x_b[..j]),   n = Σ_b (ℓ_b − 1),

with rows right-padded, so the causal mask alone keeps padding out of every scored position. An
example longer than the model's positions is trained on its first ``max_positions`` tokens. A
corpus with held-out documents (``heldout_texts()``: the code world's files kept out of
training) has the same loss measured on them at the end (:func:`causal_loss`, logged as the
``heldout`` event).

One loop, read top to bottom: draw a batch from the corpus stream, take an AdamW step, log, now
and then checkpoint. Checkpoints, resume and the run-directory rules are those of ``brisk train
base`` (:mod:`brisk.runtime.train.resume`): ``checkpoint-<step>/`` holds the trainer state,
``final/`` the model, tokenizer and ``train_config.json``, each written atomically. The tiny
preset's tokenizer already holds ``<|MASK|>``; its embedding is never trained here, like a
reserved token of a released AR model, until the conversion uses it.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import load_file
from torch import Tensor

from brisk._interrupt import Interrupted, StopSignals, stop_signals
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.train.common import TrainResult, adamw, cpu_settings
from brisk.runtime.train.evaluate import EvalReport, encode_example, evaluate
from brisk.runtime.train.idlm import IGNORE, token_ce
from brisk.runtime.train.pretrain_config import PretrainConfig
from brisk.runtime.train.resume import (
    METRICS,
    MetricsLog,
    interrupted_at,
    load_state,
    restore_rng,
    rng_state,
    save_checkpoint,
    start_checkpoint,
)

__all__ = [
    "ARBatch",
    "ar_batch",
    "ar_loss",
    "causal_loss",
    "encode",
    "final_evaluation",
    "heldout_loss",
    "heldout_texts",
    "train_ar",
]


@dataclass(frozen=True)
class ARBatch:
    input_ids: Tensor  # [B, L] right-padded
    labels: Tensor  # [B, L] x[j + 1] where it exists, IGNORE elsewhere

    @property
    def n_targets(self) -> int:
        return int((self.labels != IGNORE).sum())


def ar_batch(seqs: list[list[int]], pad_id: int) -> ARBatch:
    """Right-pad ``seqs`` and label position j with token j + 1 of its own row."""
    B, L = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    labels = torch.full((B, L), IGNORE, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s)
        labels[b, : len(s) - 1] = torch.as_tensor(s[1:])
    return ARBatch(ids, labels)


def ar_loss(model: Any, batch: ARBatch) -> Tensor:
    """Mean next-token cross-entropy of the batch (module docstring), float32."""
    logits = model(input_ids=batch.input_ids, use_cache=False).logits
    return token_ce(logits, batch.labels).sum() / max(batch.n_targets, 1)


@torch.no_grad()
def causal_loss(
    model: Any, tokenizer: Any, texts: list[str], max_positions: int, batch_size: int = 8
) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats per token) of ``texts`` read as training reads a
    document (``[bos, text, eos]``, its first ``max_positions`` tokens), and the number of
    tokens scored: the held-out loss of a corpus whose documents were kept out of training."""
    if not texts:
        raise ValueError("texts: need at least one document to score")
    seqs = [encode_example("", t, tokenizer)[0][:max_positions] for t in texts]
    total, n = 0.0, 0
    for i in range(0, len(seqs), batch_size):
        batch = ar_batch(seqs[i : i + batch_size], tokenizer.pad_token_id)
        logits = model(input_ids=batch.input_ids, use_cache=False).logits
        total += token_ce(logits, batch.labels).sum().item()
        n += batch.n_targets
    return total / n, n


def encode(example: Any, tokenizer: Any) -> list[int]:
    """``[bos, prompt, response, eos]`` token ids of a corpus example (its ``prompt`` and
    ``response``)."""
    return encode_example(example.prompt, example.response, tokenizer)[0]


def train_ar(
    cfg: PretrainConfig, show_progress: bool = True, *, resume: bool = True
) -> TrainResult:
    """Pre-train into ``cfg.out_dir``; ``resume`` continues an interrupted run there (the rules of
    :func:`~brisk.runtime.train.resume.start_checkpoint`). SIGINT or SIGTERM ends it with a
    checkpoint and :class:`~brisk._interrupt.Interrupted`."""
    with cpu_settings(cfg.threads), stop_signals() as stop:
        return _train(cfg, show_progress, resume, stop)


def _train(
    cfg: PretrainConfig, show_progress: bool, resume: bool, stop: StopSignals
) -> TrainResult:
    out = Path(cfg.out_dir)
    start = start_checkpoint(out, resume, cfg)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    done = 0

    # Model and data: a fresh model of the preset; the corpus stream is a function of the seed,
    # so a resumed run skips the step · batch_size examples already drawn.
    model, tokenizer = cfg.model.build()
    pad_id = tokenizer.pad_token_id
    optimizer = adamw(model, cfg.lr, cfg.weight_decay)

    state = load_state(start) if start is not None else {}
    metrics = MetricsLog(out / METRICS, keep=state.get("metrics_bytes", 0))
    if start is not None:
        model.load_state_dict(load_file(start / "model.safetensors"))
        optimizer.load_state_dict(state["optimizer"])
        restore_rng(state["rng"])
        done = state["step"]
    else:
        n_params = sum(p.numel() for p in model.parameters())
        metrics.write({"event": "start", "params": n_params, "config": cfg.to_dict()})
    corpus = cfg.corpus.build(split="train", n=1, seed=cfg.seed).corpus(cfg.seed)
    heldout = heldout_texts(cfg)
    if heldout == []:  # a corpus that holds out files, none of them this time
        print(
            "brisk: the corpus holds no held-out document (its split keeps every file for "
            "training): no held-out loss is logged",
            file=sys.stderr,
        )
    limit = cfg.model.max_positions
    stream = islice(corpus, done * cfg.batch_size, None)

    def save(path: Path) -> Path:
        return save_checkpoint(
            model,
            tokenizer,
            cfg,
            path,
            state={
                "step": done,
                "optimizer": optimizer.state_dict(),
                "rng": rng_state(),
                "metrics_bytes": metrics.size,
                "elapsed_s": time.monotonic() - t0,
            },
        )

    progress = Progress(
        TextColumn("train ar"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not show_progress,
    )
    t0 = time.monotonic() - state.get("elapsed_s", 0.0)
    with progress:
        bar = progress.add_task("train", total=cfg.steps, completed=done, info="")
        model.train()
        for step in range(done, cfg.steps):
            if stop.requested:
                raise interrupted_at(step, cfg.steps, out / f"checkpoint-{step:06d}", save, metrics)

            # Step: next-token CE over whole examples, cosine schedule as `train base`.
            pairs = [next(stream) for _ in range(cfg.batch_size)]  # (example, response)
            seqs = [encode_example(ex.prompt, response, tokenizer)[0] for ex, response in pairs]
            seqs = [s[:limit] for s in seqs]  # a document past the positions: its first window
            batch = ar_batch(seqs, pad_id)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr_at_step(step)
            loss = ar_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            done = step + 1

            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                metrics.write(
                    {
                        "event": "train",
                        "step": step,
                        "lr": cfg.lr_at_step(step),
                        "loss": loss.item(),
                        "elapsed_s": time.monotonic() - t0,
                    }
                )
            progress.update(bar, advance=1, info=f"loss {loss.item():.3f}")
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                save(out / f"checkpoint-{done:06d}")
            if (time.monotonic() - t0) / 60 > cfg.max_minutes:
                metrics.write({"event": "budget", "step": done, "elapsed_s": time.monotonic() - t0})
                break

    train_wall = time.monotonic() - t0
    final = save_checkpoint(model, tokenizer, cfg, out / "final")
    report = None
    if cfg.final_eval_problems:
        try:
            with stop.abortable():
                report = final_evaluation(cfg, model, tokenizer)
        except KeyboardInterrupt:
            raise Interrupted(
                f"during the final evaluation; the model is saved in {final}"
            ) from None
        metrics.write({"event": "eval", "step": done, **report.to_dict()})
    scored = heldout_loss(cfg, model, tokenizer) if heldout else None
    if scored is not None:
        metrics.write({"event": "heldout", "step": done, **scored})
    metrics.write({"event": "end", "train_wall_s": train_wall, "wall_s": time.monotonic() - t0})
    metrics.close()
    return TrainResult(final, metrics.records, report, train_wall)


def heldout_texts(cfg: PretrainConfig) -> list[str] | None:
    """The corpus's held-out documents (a corpus task with ``heldout_texts()``, the code
    world's; ``[]`` when its split holds none out), or None for a corpus without a held-out
    side."""
    task = cfg.corpus.build(split="test", n=1, seed=cfg.eval_seed)
    texts = getattr(task, "heldout_texts", None)
    return None if texts is None else list(texts())


def heldout_loss(cfg: PretrainConfig, model: Any, tokenizer: Any) -> dict[str, Any] | None:
    """``{"loss", "tokens"}``: :func:`causal_loss` of the corpus's held-out documents
    (:func:`heldout_texts`), each cut to the model's positions; None when there are none."""
    texts = heldout_texts(cfg)
    if not texts:
        return None
    model.eval()
    loss, tokens = causal_loss(model, tokenizer, texts, cfg.model.max_positions)
    return {"loss": loss, "tokens": tokens}


def final_evaluation(cfg: PretrainConfig, model: Any, tokenizer: Any) -> EvalReport:
    """Greedy answer accuracy of the causal LM on the corpus task's held-out problems, graded by
    that task (the broad corpus's: its target world's; the MASK stream is untrained here, so no
    proposal accuracy)."""
    world = cfg.corpus.build(split="test", n=cfg.final_eval_problems, seed=cfg.eval_seed)
    model.eval()
    return evaluate(
        HFBackbone(model, tokenizer.mask_token_id),
        tokenizer,
        world.problems(),
        strides=(),
        task=world,
    )
