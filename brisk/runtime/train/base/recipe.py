"""I-DLM training of a base model (``brisk train base --config FILE``): a model preset (the tiny
Qwen3) on a registered world's corpus (the arithmetic world), or a user's causal LM (``init``:
the I-DLM conversion recipe, at a fine-tuning learning rate by default,
:data:`~brisk.runtime.train.base.config.INIT_LR`) on the world or on a user's prompts and responses
(``data``: a file task whose records have ``prompt`` and ``response`` fields). A checkpoint
without a MASK token trains with ``mask_token_id`` (an id it never uses) or gets a row of its
own (``add_mask_token``); either way the checkpoints written carry the id in their config.

One loop, read top to bottom: draw a batch of training problems, build ``[x_t | x_0]`` for the
curriculum's current stride, take an AdamW step, log, now and then evaluate and checkpoint.
Outputs under ``cfg.out_dir``: ``metrics.jsonl`` (one JSON object per log/eval event),
``checkpoint-<step>/`` and ``final/`` (``save_pretrained`` model + tokenizer +
``train_config.json``, each written to a temporary directory and renamed into place, so a reader
never sees half of one). A ``checkpoint-<step>/`` also holds ``trainer_state.pt`` (optimizer,
step, the block-offset and global RNG states, the size of ``metrics.jsonl``), which ``final/``
does not (a finished run is never resumed): SIGINT or SIGTERM stops the
run between steps with a checkpoint of the step it reached, and ``resume`` continues from the
newest one to the same parameters, bit for bit on CPU, as a run that was never stopped
(:mod:`brisk.runtime.train.resume` has the rules of a run directory).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import load_file

from brisk.runtime.backbone import HFBackbone, resolve_mask_id
from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.common import TrainingTokens, adamw, carry_mask, init_tokens
from brisk.runtime.train.distributed import autocast, grad_sync, load_for_training, micro_batches
from brisk.runtime.train.evaluate import EvalReport, encode_problem, evaluate
from brisk.runtime.train.forward import set_attention, training_forward
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train
from brisk.runtime.train.idlm import IGNORE, auto_alpha, build_batch, label_counts
from brisk.runtime.train.packing import pack_batch
from brisk.runtime.train.resume import write_checkpoint
from brisk.runtime.train.vocab import StreamLosses, stream_losses

__all__ = ["BaseRecipe", "TrainResult", "train_base"]


def _slot_sums(ce: torch.Tensor, batch: Any) -> torch.Tensor:
    """``[2, M]`` (float64): the MASK slots' CE ``ce [B, L]`` summed per proposal position, and
    their count."""
    ok = batch.noisy_labels != IGNORE
    slot = batch.slot.expand_as(ok)[ok].cpu()
    out = torch.zeros(2, batch.M, dtype=torch.float64)
    out[0].index_add_(0, slot, ce[ok].double().cpu())
    out[1].index_add_(0, slot, torch.ones(slot.numel(), dtype=torch.float64))
    return out


def _check_fits(seqs: list[list[int]], limit: int, option: str, step: int) -> None:
    """Every sequence fits ``limit`` tokens (the model's positions, or a packed row): else an
    error naming the option, before the step is taken."""
    longest = max(len(s) for s in seqs)
    if longest > limit:
        what = "a packed row" if option == "pack_tokens" else "the model's positions"
        raise ValueError(
            f"{option}: step {step} drew a {longest}-token example, longer than "
            f"{what} ({limit} tokens)"
        )


def _check_prompts(prompt_lens: list[int], limit: int, step: int) -> None:
    """Every prompt leaves a response token inside the model's positions (a longer example is
    cut to them): else an error naming the data, before the step is taken."""
    longest = max(prompt_lens)
    if longest >= limit:
        raise ValueError(
            f"data: step {step} drew an example whose prompt ({longest} tokens) leaves no "
            f"response token in the model's positions ({limit} tokens)"
        )


def _tokens(cfg: BaseTrainConfig) -> TrainingTokens:
    """The model preset's tokenizer and MASK id, or ``cfg.init``'s (with the MASK token added
    when asked: :func:`~brisk.runtime.train.common.init_tokens`), checked before anything is
    written."""
    if cfg.init:
        return init_tokens(cfg.init, cfg)
    tokenizer = cfg.model.tokenizer()
    rows = SimpleNamespace(vocab_size=len(tokenizer))  # the preset's embedding rows
    mask_id = resolve_mask_id(tokenizer, rows, cfg.mask_token_id, source="the model preset")
    return TrainingTokens(tokenizer, mask_id, tokenizer.pad_token_id)


def _model(cfg: BaseTrainConfig, tokens: TrainingTokens, start: Path | None) -> Any:
    """A fresh model of the preset ``cfg.model``, or the checkpoint ``cfg.init`` (its embeddings
    grown to the tokenizer's MASK token when asked), on the CPU in fp32, carrying the run's MASK
    id, with the weights of the checkpoint ``start`` it resumes from."""
    from brisk.runtime.architectures import load_causal_lm

    model = load_causal_lm(cfg.init, False, torch.float32) if cfg.init else cfg.model.build()[0]
    carry_mask(model, tokens, cfg.add_mask_token)
    if start is not None:
        model.load_state_dict(load_file(start / "model.safetensors"), strict=not cfg.init)
    return model


def _world(cfg: BaseTrainConfig, split: str, n: int, seed: int) -> Any:
    """``n`` problems of ``split`` of the world ``cfg.task`` (a registered task), drawn with
    ``seed``."""
    return cfg.task.build(split=split, n=n, seed=seed)


def _pairs(cfg: BaseTrainConfig, tokenizer: Any) -> Iterator[tuple[Any, str]]:
    """Endless (problem, response) pairs: the world's base corpus, or the records of
    ``cfg.data`` (its ``response`` field), each epoch in an order shuffled with the seed."""
    if cfg.data.is_default:
        yield from _world(cfg, "train", 1, cfg.seed).corpus(cfg.seed)
        return
    task = cfg.data.resolve(n=10**12, seed=cfg.seed)
    problems = task.problems(tokenizer)
    if not problems:
        raise ValueError("data: the selection holds no examples")
    responses = task.references(problems, 1)
    for epoch in itertools.count():
        order = list(range(len(problems)))
        random.Random(f"{cfg.seed}:data:{epoch}").shuffle(order)
        for i in order:
            yield problems[i], responses[i][0]


def train_base(
    cfg: BaseTrainConfig, show_progress: bool = True, *, resume: bool = True
) -> TrainResult[EvalReport | None]:
    """Train the base model into ``cfg.out_dir`` through the harness
    (:func:`~brisk.runtime.train.harness.train`: resume by default, SIGINT or SIGTERM ends it
    with a checkpoint); the outcome is the final held-out evaluation (None if disabled)."""
    return train(BaseRecipe(cfg), show_progress, resume=resume)


class BaseRecipe(Recipe[BaseTrainConfig, EvalReport | None]):
    """I-DLM training (module docstring): batches of ``[x_t | x_0]`` at the curriculum's stride,
    the loss CE_noisy + α·CE_clean."""

    label = "train base"

    def __init__(self, cfg: BaseTrainConfig) -> None:
        # The rates a default resolved to (from scratch or from init) are the run's: saved with
        # it, compared on resume.
        super().__init__(cfg.resolved())
        self.rng = random.Random(cfg.seed)  # block offsets
        self.alpha: float | None = None  # α (auto) for the next step: the last step's CE ratio

    def build(self, run: Run) -> None:
        cfg = self.cfg
        self.tokens = _tokens(cfg)  # a MASK id that cannot be is refused before any write
        # Training problems stream from the world's train split (or a user's file, epoch after
        # shuffled epoch); evaluation uses distinct problems of the test split, which never
        # shares a problem with training (a user's data: none here; evaluate with
        # `brisk train eval --task FILE`). Under FSDP rank 0 alone reads the weights; the
        # others receive their shards (load_for_training).
        self.model, self.net = load_for_training(
            lambda: _model(cfg, self.tokens, run.start),
            run.dist,
            fsdp=cfg.fsdp,
            precision=run.precision,
            checkpointing=cfg.activation_checkpointing,
            device=run.device,
        )
        self.limit = int(getattr(self.model.config, "max_position_embeddings", 0) or 10**9)
        n_eval = max(cfg.eval_problems, cfg.final_eval_problems) if cfg.data.is_default else 0
        self.eval_world = _world(cfg, "test", n_eval, cfg.eval_seed) if n_eval else None
        self.held_out = self.eval_world.problems() if self.eval_world is not None else []
        self.own_attention = set_attention(self.model, cfg.attention)  # checkpoints stay plain
        self.precision = autocast(run.precision, cfg.fsdp, run.device)
        self.head = self.model.get_output_embeddings()
        self.optimizer = adamw(self.model, cfg.peak_lr, cfg.weight_decay)
        self.mine = run.dist.rows(cfg.batch_size)  # this rank's rows of every global batch

    def state_dict(self) -> dict[str, Any]:
        return {"offsets": self.rng.getstate(), "alpha": self.alpha}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["offsets"])
        self.alpha = state.get("alpha")

    def begin(self, run: Run) -> None:
        # Every step draws batch_size problems: a resumed stream continues after them.
        pairs = _pairs(self.cfg, self.tokens.tokenizer)
        self.stream = islice(pairs, run.step * self.cfg.batch_size, None)
        self.model.train()

    def measure(self, batch: Any) -> StreamLosses:
        """One forward: the micro-batch's per-position losses (with their graph when gradients
        are on), the LM head applied in chunks."""
        with self.precision:
            h_noisy, h_clean = training_forward(self.net, batch, self.cfg.attention, hidden=True)
            return stream_losses(h_noisy, h_clean, self.head.weight, batch, temperature=0.0)

    def batches(self, run: Run, step: int, M: int) -> list[Any]:
        """This rank's rows of step ``step``'s global batch, in micro-batches laid out in
        blocks of ``M`` (packed end to end in rows of ``pack_tokens`` when set)."""
        cfg, tokenizer = self.cfg, self.tokens.tokenizer
        mask_id, pad_id = self.tokens.mask_id, self.tokens.pad_id
        drawn = [next(self.stream) for _ in range(cfg.batch_size)]
        offset = self.rng.randrange(M) if cfg.random_block_offset else 0
        batches: list[Any] = []
        for rows in micro_batches(drawn[self.mine], cfg.micro_batch_size):
            encoded = [encode_problem(p, tokenizer, response) for p, response in rows]
            seqs, prompt_lens = [s for s, _ in encoded], [n for _, n in encoded]
            if not cfg.pack_tokens:  # an over-long example: its first window, as train ar's
                _check_prompts(prompt_lens, self.limit, step)
                seqs = [s[: self.limit] for s in seqs]
            option = "pack_tokens" if cfg.pack_tokens else "data"
            _check_fits(seqs, cfg.pack_tokens or self.limit, option, step)
            if cfg.pack_tokens:
                batch = pack_batch(
                    seqs, prompt_lens, M, mask_id, pad_id, cfg.pack_tokens, offset, run.device
                )
            else:
                dense = cfg.attention == "dense"
                batch = build_batch(
                    seqs,
                    prompt_lens,
                    M,
                    mask_id,
                    pad_id,
                    offset,
                    device=run.device,
                    dense_mask=dense,
                )
            batches.append(batch)
        return batches

    def step(self, run: Run, step: int) -> StepRecord:
        cfg, dist = self.cfg, run.dist
        # The curriculum's stride fixes the block size M = N − 1 of the mask.
        N = cfg.stride_at(step)
        M = N - 1
        batches = self.batches(run, step, M)
        lr = cfg.lr_at_step(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        # The step's loss CE_noisy + α·CE_clean over the global batch: its denominators are
        # label counts (known before any forward), α (auto) the CE ratio measured at the
        # previous step (the first step: a probe of its own batch), so every micro-batch is
        # forwarded once (module docstring of brisk.runtime.train.proposal.recipe).
        counts = dist.sum(torch.stack([label_counts(b) for b in batches]).sum(0))
        n_noisy, n_clean = max(float(counts[0]), 1.0), max(float(counts[1]), 1.0)
        if cfg.alpha != "auto":
            self.alpha = float(cfg.alpha)
        elif self.alpha is None:
            with torch.no_grad():
                zero = torch.zeros(4, dtype=torch.float64)
                probed = dist.sum(sum((self.measure(b).totals(b) for b in batches), zero))
            self.alpha = auto_alpha(float(probed[0]) / n_noisy, float(probed[1]) / n_clean)

        # Each micro-batch's share, from its one forward; gradients are reduced across ranks
        # once, after the last micro-batch.
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros(4, dtype=torch.float64)  # loss totals
        slots = torch.zeros(2, M, dtype=torch.float64)  # slot CE sums, counts
        used = self.alpha
        for k, batch in enumerate(batches):
            with grad_sync(self.net, k == len(batches) - 1):
                losses = self.measure(batch)
                noisy, clean = losses.noisy.sum(), losses.clean.sum()
                loss = dist.world * (noisy / n_noisy + used * clean / n_clean)
                loss.backward()
            local += losses.totals(batch)
            slots += _slot_sums(losses.noisy.detach(), batch)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        totals = dist.sum(local)
        if cfg.alpha == "auto":  # the next step's
            self.alpha = auto_alpha(float(totals[0]) / n_noisy, float(totals[1]) / n_clean)

        # Slot CE is averaged over every MASK slot of the global batch.
        ce_noisy, ce_clean = float(totals[0]) / n_noisy, float(totals[1]) / n_clean
        sums, slot_n = dist.sum(slots)
        fields = {
            "stride": N,
            "lr": lr,
            "loss": ce_noisy + used * ce_clean,
            "ce_noisy": ce_noisy,
            "ce_clean": ce_clean,
            "alpha": used,
            "slot_ce": (sums / slot_n.clamp(min=1)).tolist(),
        }
        return StepRecord(fields, f"N={N} clean {ce_clean:.3f} noisy {ce_noisy:.3f}")

    def run_eval(self, run: Run, step: int, n: int) -> EvalReport:
        """Decode ``n`` held-out problems and log the report. Every rank decodes the same
        problems (a sharded forward needs every shard)."""
        model = self.model
        model.set_attn_implementation(self.own_attention)  # decoding passes its own masks
        model.eval()
        backbone = HFBackbone(model, self.tokens.mask_id)
        report = evaluate(backbone, self.tokens.tokenizer, self.held_out[:n], task=self.eval_world)
        set_attention(model, self.cfg.attention)
        model.train()
        run.log({"event": "eval", "step": step, "elapsed_s": run.elapsed(), **report.to_dict()})
        return report

    def evaluate(self, run: Run, done: int, finished: bool) -> None:
        every = self.cfg.eval_every
        if every and done % every == 0 and not finished:
            self.run_eval(run, done, self.cfg.eval_problems)

    def finish(self, run: Run, final: Path) -> EvalReport | None:
        n = self.cfg.final_eval_problems
        return self.run_eval(run, run.step, n) if n else None

    def write(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        write_checkpoint(directory, self.model, self.tokens.tokenizer, self.cfg, weights)
