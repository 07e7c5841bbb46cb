"""I-DLM training of a base model (``brisk train base --config FILE``): a model preset (the tiny
Qwen3) on a registered world's corpus (the arithmetic world), or a user's causal LM (``init``:
the I-DLM conversion recipe, at a fine-tuning learning rate by default,
:data:`~brisk.runtime.train.config.INIT_LR`) on the world or on a user's prompts and responses
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
import shutil
import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import load_file

from brisk._interrupt import Interrupted, StopSignals, stop_signals
from brisk.runtime.backbone import HFBackbone, resolve_mask_id
from brisk.runtime.loader import training_placement
from brisk.runtime.train.common import (
    TrainingTokens,
    TrainResult,
    adamw,
    carry_mask,
    cpu_settings,
    init_tokens,
)
from brisk.runtime.train.config import BaseTrainConfig
from brisk.runtime.train.distributed import (
    Dist,
    autocast,
    full_state_dict,
    grad_sync,
    load_for_training,
    load_sharded,
    micro_batches,
    save_sharded,
)
from brisk.runtime.train.evaluate import EvalReport, encode_problem, evaluate
from brisk.runtime.train.forward import set_attention, training_forward
from brisk.runtime.train.idlm import IGNORE, auto_alpha, build_batch, label_counts
from brisk.runtime.train.packing import pack_batch
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
from brisk.runtime.train.vocab import StreamLosses, stream_losses

__all__ = ["TrainResult", "train_base"]


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
) -> TrainResult:
    """Train the base model into ``cfg.out_dir``; with ``resume`` (the library's default, which
    the experiments rely on) an interrupted run there is continued, else a directory holding a
    run is refused (:func:`~brisk.runtime.train.resume.start_checkpoint`). SIGINT or SIGTERM
    ends it with a checkpoint and :class:`~brisk._interrupt.Interrupted`."""
    with cpu_settings(cfg.threads), stop_signals() as stop:
        return _train(cfg, show_progress, resume, stop)


def _train(
    cfg: BaseTrainConfig, show_progress: bool, resume: bool, stop: StopSignals
) -> TrainResult:
    # The rates a default resolved to (from scratch or from init) are the run's: saved with it,
    # compared on resume.
    cfg = cfg.resolved()
    dist = Dist.from_env(fsdp=cfg.fsdp)
    mine = dist.rows(cfg.batch_size)  # this rank's rows of every global batch
    device, precision_name = training_placement(cfg.device, cfg.precision, distributed=dist.group)
    out = Path(cfg.out_dir)
    start = start_checkpoint(out, resume, cfg)
    tokens = _tokens(cfg)  # a MASK id that cannot be is refused before anything is written
    tokenizer, mask_id, pad_id = tokens.tokenizer, tokens.mask_id, tokens.pad_id
    dist.barrier()  # every rank reads the directory before rank 0 writes to it
    if dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # block offsets
    done = 0  # steps taken
    alpha: float | None = None  # α (auto) for the next step: the last step's CE ratio

    # Model, tokenizer and data: training problems stream from the world's train split (or a
    # user's file, epoch after shuffled epoch); evaluation uses distinct problems of the test
    # split, which never shares a problem with training (a user's data: none here; evaluate
    # with `brisk train eval --task FILE`).
    # Under FSDP rank 0 alone reads the weights; the others receive their shards
    # (load_for_training).
    model, net = load_for_training(
        lambda: _model(cfg, tokens, start),
        dist,
        fsdp=cfg.fsdp,
        precision=precision_name,
        checkpointing=cfg.activation_checkpointing,
        device=device,
    )
    n_params = sum(p.numel() for p in model.parameters())
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 10**9)
    n_eval = max(cfg.eval_problems, cfg.final_eval_problems) if cfg.data.is_default else 0
    eval_world = _world(cfg, "test", n_eval, cfg.eval_seed) if n_eval else None
    held_out = eval_world.problems() if eval_world is not None else []
    state = load_state(start) if start is not None else {}
    own_attention = set_attention(model, cfg.attention)  # not saved: checkpoints stay plain
    precision = autocast(precision_name, cfg.fsdp, device)
    head = model.get_output_embeddings()

    def measure(batch: Any) -> StreamLosses:
        """One forward: the micro-batch's per-position losses (with their graph when gradients
        are on), the LM head applied in chunks."""
        with precision:
            h_noisy, h_clean = training_forward(net, batch, cfg.attention, hidden=True)
            return stream_losses(h_noisy, h_clean, head.weight, batch, temperature=0.0)

    optimizer = adamw(model, cfg.peak_lr, cfg.weight_decay)

    # Resume: optimizer, RNG states and the log as they were at the checkpoint; every step draws
    # batch_size problems, so the stream continues after step · batch_size of them.
    metrics = (
        MetricsLog(out / METRICS, keep=state.get("metrics_bytes", 0)) if dist.rank == 0 else None
    )
    records: list[dict[str, Any]] = []

    def log(record: dict[str, Any]) -> None:
        if metrics is not None:  # rank 0 writes the log
            metrics.write(record)

    if start is not None:
        if cfg.fsdp:
            load_sharded(start, model, optimizer)
        else:
            optimizer.load_state_dict(state["optimizer"])
        rng.setstate(state["offsets"])
        restore_rng(state["rng"])
        done = state["step"]
        alpha = state.get("alpha")
    else:
        log({"event": "start", "params": n_params, "config": cfg.to_dict()})
    pairs = _pairs(cfg, tokenizer)  # (problem, response)
    train_stream = islice(pairs, done * cfg.batch_size, None)

    def run_eval(step: int, n: int) -> EvalReport:
        # Every rank decodes the same problems (a sharded forward needs every shard).
        model.set_attn_implementation(own_attention)  # decoding passes its own dense masks
        model.eval()
        report = evaluate(HFBackbone(model, mask_id), tokenizer, held_out[:n], task=eval_world)
        set_attention(model, cfg.attention)
        model.train()
        log({"event": "eval", "step": step, "elapsed_s": time.monotonic() - t0, **report.to_dict()})
        return report

    def save(path: Path, resumable: bool = True) -> Path:
        """A checkpoint, atomically: called by rank 0 alone, or under FSDP by every rank (the
        plain weights gathered to rank 0, model and optimizer shards to ``sharded/``). Only a
        checkpoint to resume from (``resumable``) holds the trainer state and the shards."""
        state = {
            "step": done,
            "offsets": rng.getstate(),
            "rng": rng_state(),
            "alpha": alpha,
            "metrics_bytes": metrics.size if metrics is not None else 0,
            "elapsed_s": time.monotonic() - t0,
            "world_size": dist.world,
        }
        weights = full_state_dict(model, cfg.fsdp)
        tmp = path.with_name(f".{path.name}.tmp")
        sharded = cfg.fsdp and resumable
        if sharded:
            if dist.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            dist.barrier()
            save_sharded(tmp, model, optimizer)
        elif resumable:
            state["optimizer"] = optimizer.state_dict()
        if dist.rank == 0:
            kept = state if resumable else None
            save_checkpoint(model, tokenizer, cfg, path, state=kept, weights=weights, keep=sharded)
        if cfg.fsdp:
            dist.barrier()
        return path

    progress = Progress(
        TextColumn("train base"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not show_progress or dist.rank != 0,
    )
    t0 = time.monotonic() - state.get("elapsed_s", 0.0)  # a resumed run's clock goes on
    saved_at = done if start is not None else -1  # the step of the newest checkpoint on disk
    with progress:
        bar = progress.add_task("train", total=cfg.steps, completed=done, info="")
        model.train()
        for step in range(done, cfg.steps):
            # Stop between steps on SIGINT/SIGTERM (every rank at the same step), with a
            # checkpoint of the step reached.
            if dist.any(stop.requested, device):
                here = out / f"checkpoint-{step:06d}"
                if cfg.fsdp and step > 0 and step != saved_at:
                    save(here)  # every rank: rank 0's interrupted_at finds it saved
                err = Interrupted(f"at step {step}")
                if metrics is not None:
                    err = interrupted_at(step, cfg.steps, here, save, metrics)
                dist.barrier()
                raise err

            # Batch: the curriculum's stride fixes the block size M = N − 1 of the mask; this
            # rank's rows of the global batch, in micro-batches.
            N = cfg.stride_at(step)
            M = N - 1
            drawn = [next(train_stream) for _ in range(cfg.batch_size)]
            offset = rng.randrange(M) if cfg.random_block_offset else 0
            batches: list[Any] = []
            for rows in micro_batches(drawn[mine], cfg.micro_batch_size):
                encoded = [encode_problem(p, tokenizer, response) for p, response in rows]
                seqs, prompt_lens = [s for s, _ in encoded], [n for _, n in encoded]
                if not cfg.pack_tokens:  # an over-long example: its first window, as train ar's
                    _check_prompts(prompt_lens, limit, step)
                    seqs = [s[:limit] for s in seqs]
                _check_fits(
                    seqs,
                    cfg.pack_tokens or limit,
                    "pack_tokens" if cfg.pack_tokens else "data",
                    step,
                )
                if cfg.pack_tokens:  # examples end to end in rows of pack_tokens
                    batches.append(
                        pack_batch(
                            seqs, prompt_lens, M, mask_id, pad_id, cfg.pack_tokens, offset, device
                        )
                    )
                else:
                    batches.append(
                        build_batch(
                            seqs,
                            prompt_lens,
                            M,
                            mask_id,
                            pad_id,
                            offset=offset,
                            device=device,
                            dense_mask=cfg.attention == "dense",
                        )
                    )
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr_at_step(step)

            # The step's loss CE_noisy + α·CE_clean over the global batch: its denominators are
            # label counts (known before any forward), α (auto) the CE ratio measured at the
            # previous step (the first step: a probe of its own batch), so every micro-batch is
            # forwarded once (module docstring of brisk.runtime.train.proposal).
            counts = dist.sum(torch.stack([label_counts(b) for b in batches]).sum(0))
            n_noisy, n_clean = max(float(counts[0]), 1.0), max(float(counts[1]), 1.0)
            if cfg.alpha != "auto":
                alpha = float(cfg.alpha)
            elif alpha is None:
                with torch.no_grad():
                    probed = dist.sum(
                        sum(
                            (measure(b).totals(b) for b in batches),
                            torch.zeros(4, dtype=torch.float64),
                        )
                    )
                alpha = auto_alpha(float(probed[0]) / n_noisy, float(probed[1]) / n_clean)

            # Step: each micro-batch's share, from its one forward; gradients are reduced
            # across ranks once, after the last micro-batch.
            optimizer.zero_grad(set_to_none=True)
            local = torch.zeros(4, dtype=torch.float64)  # loss totals
            slots = torch.zeros(2, M, dtype=torch.float64)  # slot CE sums, counts
            used = alpha
            for k, batch in enumerate(batches):
                with grad_sync(net, k == len(batches) - 1):
                    losses = measure(batch)
                    loss = dist.world * (
                        losses.noisy.sum() / n_noisy + used * losses.clean.sum() / n_clean
                    )
                    loss.backward()
                local += losses.totals(batch)
                slots += _slot_sums(losses.noisy.detach(), batch)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            done = step + 1
            totals = dist.sum(local)
            if cfg.alpha == "auto":  # the next step's
                alpha = auto_alpha(float(totals[0]) / n_noisy, float(totals[1]) / n_clean)

            # Log: slot CE is averaged over every MASK slot of the global batch.
            ce_noisy, ce_clean = float(totals[0]) / n_noisy, float(totals[1]) / n_clean
            loss_value = ce_noisy + used * ce_clean
            if step % cfg.log_every == 0 or step == cfg.steps - 1:
                sums, slot_n = dist.sum(slots)
                log(
                    {
                        "event": "train",
                        "step": step,
                        "stride": N,
                        "lr": cfg.lr_at_step(step),
                        "loss": loss_value,
                        "ce_noisy": ce_noisy,
                        "ce_clean": ce_clean,
                        "alpha": used,
                        "slot_ce": (sums / slot_n.clamp(min=1)).tolist(),
                        "elapsed_s": time.monotonic() - t0,
                    }
                )
            progress.update(bar, advance=1, info=f"N={N} clean {ce_clean:.3f} noisy {ce_noisy:.3f}")

            # Evaluate and checkpoint now and then; stop early if the wall budget is spent
            # (rank 0's clock decides, for every rank).
            if cfg.eval_every and done % cfg.eval_every == 0 and done < cfg.steps:
                run_eval(done, cfg.eval_problems)
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                if cfg.fsdp or dist.rank == 0:
                    save(out / f"checkpoint-{done:06d}")
                saved_at = done
            over = dist.rank == 0 and (time.monotonic() - t0) / 60 > cfg.max_minutes
            if dist.any(over, device):
                log({"event": "budget", "step": done, "elapsed_s": time.monotonic() - t0})
                break

    # The trained model is saved first: an evaluation cut short by a signal loses only itself.
    train_wall = time.monotonic() - t0
    final = out / "final"
    if cfg.fsdp or dist.rank == 0:
        save(final, resumable=False)
    report = None
    if cfg.final_eval_problems:
        try:
            with stop.abortable():
                report = run_eval(done, cfg.final_eval_problems)
        except KeyboardInterrupt:
            raise Interrupted(
                f"during the final evaluation; the trained model is saved in {final} "
                f"(brisk train eval --checkpoint {final} evaluates it)"
            ) from None
    log({"event": "end", "train_wall_s": train_wall, "wall_s": time.monotonic() - t0})
    if metrics is not None:
        metrics.close()
        records = metrics.records
    dist.barrier()
    return TrainResult(final, records, report, train_wall)
