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
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.train.common import adamw
from brisk.runtime.train.evaluate import EvalReport, encode_example, evaluate
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train
from brisk.runtime.train.idlm import IGNORE, token_ce
from brisk.runtime.train.pretrain.config import PretrainConfig
from brisk.runtime.train.resume import write_checkpoint

__all__ = [
    "ARBatch",
    "PretrainRecipe",
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
) -> TrainResult[EvalReport | None]:
    """Pre-train into ``cfg.out_dir`` through the harness
    (:func:`~brisk.runtime.train.harness.train`: resume by default, SIGINT or SIGTERM ends it
    with a checkpoint); the outcome is the final evaluation (None if disabled)."""
    return train(PretrainRecipe(cfg), show_progress, resume=resume)


class PretrainRecipe(Recipe[PretrainConfig, EvalReport | None]):
    """Next-token cross-entropy over whole examples of the corpus, the cosine schedule of
    ``brisk train base``."""

    label = "train ar"

    def build(self, run: Run) -> None:
        cfg = self.cfg
        random.seed(cfg.seed)
        # A fresh model of the preset, with a resumed run's weights.
        self.model, self.tokenizer = cfg.model.build()
        if run.start is not None:
            self.model.load_state_dict(load_file(run.start / "model.safetensors"))
        self.optimizer = adamw(self.model, cfg.lr, cfg.weight_decay)
        self.heldout = heldout_texts(cfg)  # read once: logged as ``heldout`` at the end
        if self.heldout == []:  # a corpus that holds out files, none of them this time
            print(
                "brisk: the corpus holds no held-out document (its split keeps every file for "
                "training): no held-out loss is logged",
                file=sys.stderr,
            )

    def begin(self, run: Run) -> None:
        # The corpus stream is a function of the seed: a resumed run skips the examples drawn.
        corpus = self.cfg.corpus.build(split="train", n=1, seed=self.cfg.seed).corpus(self.cfg.seed)
        self.stream = islice(corpus, run.step * self.cfg.batch_size, None)
        self.model.train()

    def step(self, run: Run, step: int) -> StepRecord:
        cfg, limit = self.cfg, self.cfg.model.max_positions
        pairs = [next(self.stream) for _ in range(cfg.batch_size)]  # (example, response)
        seqs = [encode_example(ex.prompt, response, self.tokenizer)[0] for ex, response in pairs]
        seqs = [s[:limit] for s in seqs]  # a document past the positions: its first window
        batch = ar_batch(seqs, self.tokenizer.pad_token_id)
        lr = cfg.lr_at_step(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = ar_loss(self.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return StepRecord({"lr": lr, "loss": loss.item()}, f"loss {loss.item():.3f}")

    def finish(self, run: Run, final: Path) -> EvalReport | None:
        report = None
        if self.cfg.final_eval_problems:
            report = final_evaluation(self.cfg, self.model, self.tokenizer)
            run.log({"event": "eval", "step": run.step, **report.to_dict()})
        scored = heldout_loss(self.cfg, self.model, self.tokenizer, self.heldout)
        if scored is not None:
            run.log({"event": "heldout", "step": run.step, **scored})
        return report

    def write(self, directory: Path, weights: dict[str, Tensor] | None) -> None:
        write_checkpoint(directory, self.model, self.tokenizer, self.cfg, weights)


def heldout_texts(cfg: PretrainConfig) -> list[str] | None:
    """The corpus's held-out documents (a corpus task with ``heldout_texts()``, the code
    world's; ``[]`` when its split holds none out), or None for a corpus without a held-out
    side."""
    task = cfg.corpus.build(split="test", n=1, seed=cfg.eval_seed)
    texts = getattr(task, "heldout_texts", None)
    return None if texts is None else list(texts())


def heldout_loss(
    cfg: PretrainConfig, model: Any, tokenizer: Any, texts: list[str] | None = None
) -> dict[str, Any] | None:
    """``{"loss", "tokens"}``: :func:`causal_loss` of the corpus's held-out documents
    (``texts``, else :func:`heldout_texts`), each cut to the model's positions; None when there
    are none."""
    if texts is None:
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
