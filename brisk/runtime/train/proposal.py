"""Risk–reward proposal training (``brisk train proposal``): continued I-DLM training in which
the M proposal (MASK-stream) losses are weighted per position (eq:brisk_weighting):

    L = Σ_j w̄_{i(j)} ℓ_j / n_noisy + α · CE_clean,

a token mean over the MASK slots j with a label (i(j) the slot's proposal position), which is
(1/M) Σ_i w̄_i L_i^prop when every position has the same count and the plain I-DLM loss when
w̄ ≡ 1. The weights are constants in backprop. With ``weights = "brisk"`` they are
``progress_weights`` (ISD cost model) of the acceptance profile: ``dynamic`` re-estimates it at
every step from the batch's own proposals under the ISD rule
(:mod:`brisk.runtime.train.acceptance`) and tracks it with :class:`ProfileTracker`; ``static``
estimates it once, on ``static_batches`` batches of the training data, before the first step.
The profile used is the tracker's Jeffreys posterior mean (accepted + ½)/(reached + 1), which
has no 0/0 at an unreached position.

Memory at the users' scale: every micro-batch is forwarded once, to its last hidden states, and
the losses and each MASK slot's acceptance probability come from the LM head applied in chunks
(:func:`~brisk.runtime.train.vocab.stream_losses`): no ``[B, 2L, V]`` logits. A step's loss is
divided by the global batch's label counts, known before any forward; its profile and its α
(``alpha = "auto"``: CE_noisy / CE_clean) are the ones measured up to the previous step — the
tracker folds each step's verdicts in after the step, and the first step takes them from a
probe of its own batch without gradients. Measuring them on the step's own batch would need
every micro-batch forwarded twice (once to measure, once to backpropagate with weights known),
or all of them held in memory.

One loop, read top to bottom. Under ``torchrun --nproc-per-node P`` (gloo on CPU, nccl on GPU)
every rank takes rows ``rank::P`` of the same global batch and the model is wrapped in DDP; the
loss is divided by the *global* token counts (all-reduced), the acceptance counts are
all-reduced, so every rank uses the same weights and the run matches a single process at the
same global batch, split into any number of micro-batches, up to float summation order. Rank 0
writes ``metrics.jsonl`` (one record per step: weights, profile, losses), checkpoints and
``weights.png``.

Checkpoints (``checkpoint-NNNNNN/`` every ``save_every`` steps and ``final/``) hold the model
(safetensors + HF config, which records the run's MASK id: ``mask_token_id`` or the row
``add_mask_token`` adds to an ``init`` without one), tokenizer, the base run's
``train_config.json`` and this run's ``proposal_config.json``; a ``checkpoint-NNNNNN/`` also
holds ``trainer_state.pt`` (optimizer, step, tokens seen, data cursor, profile tracker, RNG
states, the size of ``metrics.jsonl``), which ``final/`` does not (a finished run is never
resumed); each is written to a temporary directory and renamed. SIGINT or SIGTERM stops the
run between steps with a checkpoint of the step it reached; under torchrun the ranks
all-reduce their stop flag at every step, so all stop at the same step, rank 0 saves while the
others wait. ``resume`` continues from the newest
checkpoint and ends bit-identical to an uninterrupted run on CPU; the rules of a run directory
(a used one is refused without ``resume``, another configuration is named) are those of
:mod:`brisk.runtime.train.resume`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from brisk._atomic import building_dir
from brisk._interrupt import Interrupted, StopSignals, stop_signals
from brisk.runtime.loader import training_placement
from brisk.runtime.train.acceptance import (
    acceptance_histogram,
    profile_counts,
    slot_weight_sums,
    token_weights,
    upcoming_profile,
)
from brisk.runtime.train.common import adamw, carry_mask, cpu_settings, init_tokens
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
from brisk.runtime.train.forward import set_attention, training_forward
from brisk.runtime.train.idlm import (
    IDLMBatch,
    auto_alpha,
    label_counts,
    loss_totals,
    weighted_loss,
)
from brisk.runtime.train.proposal_config import ProposalTrainConfig
from brisk.runtime.train.proposal_data import (
    Example,
    ExampleStream,
    check_lengths,
    example_batch,
    load_examples,
)
from brisk.runtime.train.resume import (
    METRICS,
    STATE,
    MetricsLog,
    interrupted_at,
    latest_checkpoint,
    load_state,
    restore_rng,
    rng_state,
    start_checkpoint,
)
from brisk.runtime.train.vocab import stream_losses
from brisk.theory import AcceptanceProfile, ProfileTracker

__all__ = [
    "ProposalResult",
    "latest_checkpoint",
    "loss_totals",
    "train_proposal",
    "weighted_loss",
]


@dataclass(frozen=True)
class ProposalResult:
    checkpoint: Path  # final/
    history: list[dict[str, Any]]  # rank 0: every record of metrics.jsonl; others: their own
    steps: int
    tokens: int
    wall_s: float


def _save(
    path: Path,
    model: Any,
    tokenizer: Any,
    cfg: ProposalTrainConfig,
    state: dict[str, Any],
    dist: Dist,
    optimizer: torch.optim.Optimizer,
    resumable: bool = True,
) -> Path:
    """Write a checkpoint atomically (temporary directory, renamed into place). Without FSDP
    rank 0 alone calls it; under FSDP every rank does: the plain weights are gathered to rank
    0 and the model and optimizer shards of every rank go to ``sharded/`` (DCP). Only a
    checkpoint to resume from (``resumable``) holds the trainer state and the shards."""
    tmp = path.with_name(f".{path.name}.tmp")
    weights = full_state_dict(model, cfg.fsdp)  # a collective under FSDP
    if dist.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if cfg.fsdp and resumable:
        dist.barrier()
        save_sharded(tmp, model, optimizer)
    elif resumable:
        state = {**state, "optimizer": optimizer.state_dict()}
    if dist.rank == 0:
        with building_dir(path, keep=True):  # the shards are in it; removed if a write fails
            model.save_pretrained(tmp, state_dict=weights)
            tokenizer.save_pretrained(tmp)
            world = Path(cfg.init) / "train_config.json"  # a brisk base's world travels with it
            if world.is_file():
                shutil.copy(world, tmp / "train_config.json")
            (tmp / "proposal_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
            if resumable:
                torch.save(state, tmp / STATE)
    if cfg.fsdp:
        dist.barrier()
    return path


def _kept_log(state: dict[str, Any], metrics: Path) -> int:
    """The bytes of ``metrics.jsonl`` a run resumed from ``state`` keeps: the size its checkpoint
    noted, or, for a checkpoint written before checkpoints noted it, the records up to its
    step."""
    if not state or "metrics_bytes" in state:
        return int(state.get("metrics_bytes", 0))
    lines = metrics.read_text().splitlines(keepends=True) if metrics.is_file() else []
    return sum(len(line.encode()) for line in lines if json.loads(line)["step"] <= state["step"])


def train_proposal(
    cfg: ProposalTrainConfig, *, resume: bool = False, show_progress: bool = True
) -> ProposalResult:
    """Train (or, with ``resume``, continue) a proposal model; see the module docstring. Without
    ``resume`` a directory that holds a run is refused
    (:func:`~brisk.runtime.train.resume.start_checkpoint`). SIGINT or SIGTERM ends it between
    steps with a checkpoint and :class:`~brisk._interrupt.Interrupted`."""
    with cpu_settings(cfg.threads), stop_signals() as stop:
        return _train(cfg, resume, show_progress, stop)


def _train(
    cfg: ProposalTrainConfig, resume: bool, show_progress: bool, stop: StopSignals
) -> ProposalResult:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from brisk.runtime.architectures import load_causal_lm

    dist = Dist.from_env(fsdp=cfg.fsdp)
    mine = dist.rows(cfg.batch_size)  # this rank's rows of every global batch
    device, precision_name = training_placement(cfg.device, cfg.precision, distributed=dist.group)
    out, M = Path(cfg.out_dir), cfg.M
    examples = load_examples(cfg)
    tokens = init_tokens(cfg.init, cfg)  # a MASK id that cannot be: refused before any write
    tokenizer, ids = tokens.tokenizer, (tokens.mask_id, tokens.pad_id)

    # Where to start: the init checkpoint, or the newest checkpoint of this run. Every rank
    # reads the directory before rank 0 writes to it.
    start = start_checkpoint(out, resume, cfg, "proposal_config.json")
    dist.barrier()
    torch.manual_seed(cfg.seed)

    # Under FSDP rank 0 alone reads the weights; the others receive their shards.
    def build() -> Any:
        model = load_causal_lm(start or cfg.init, False, torch.float32)
        carry_mask(model, tokens, cfg.add_mask_token)
        return model

    model, net = load_for_training(
        build,
        dist,
        fsdp=cfg.fsdp,
        precision=precision_name,
        checkpointing=cfg.activation_checkpointing,
        device=device,
    )
    check_lengths(examples, tokenizer, model.config, cfg.dataset)
    set_attention(model, cfg.attention)  # not saved with the model: checkpoints stay plain
    optimizer = adamw(model, cfg.lr, cfg.weight_decay)
    tracker = ProfileTracker(M, cfg.profile_decay)
    step, tokens, static_rates = 0, 0, None
    stream = ExampleStream(examples, cfg.seed)
    state = load_state(start) if start is not None else {}
    if start is not None:
        if cfg.fsdp:
            load_sharded(start, model, optimizer)
        else:
            optimizer.load_state_dict(state["optimizer"])
        step, tokens, static_rates = state["step"], state["tokens"], state["static_rates"]
        stream = ExampleStream(examples, cfg.seed, **state["cursor"])
        tracker.load_state_dict(state["tracker"])
        restore_rng(state["rng"])
    precision = autocast(precision_name, cfg.fsdp, device)
    head = model.get_output_embeddings()
    upcoming: dict[str, Any] | None = state.get("upcoming")  # the next step's profile and α

    def measure(batch: IDLMBatch, rows: Sequence[tuple[int, Example]]) -> tuple[Any, Tensor]:
        """One forward: the micro-batch's per-position losses (with their graph, when
        gradients are on) and its accept-length histogram and loss totals ``[M + 1 + 4]``."""
        with precision:
            h_noisy, h_clean = training_forward(net, batch, cfg.attention, hidden=True)
            losses = stream_losses(
                h_noisy, h_clean, head.weight, batch, temperature=cfg.temperature, top_k=cfg.top_k
            )
        return losses, torch.cat(
            [acceptance_histogram(losses.beta, batch, rows, cfg), losses.totals(batch)]
        )

    def probe(batches: Sequence[tuple[Sequence[Any], IDLMBatch]]) -> Tensor:
        """Histogram and totals of batches, summed over ranks, without gradients."""
        local = torch.zeros(M + 1 + 4, dtype=torch.float64)
        with torch.no_grad():
            for rows, batch in batches:
                local += measure(batch, rows)[1]
        return dist.sum(local)

    # Static profile: the initial model's acceptance on a few batches of the training data.
    if cfg.weights == "brisk" and cfg.profile == "static" and static_rates is None:
        draws = ExampleStream(examples, cfg.seed + 1)
        batches = [
            (rows, example_batch(cfg, rows, tokenizer, -1 - k, device, ids))
            for k in range(cfg.static_batches)
            for rows in micro_batches(draws.take(cfg.batch_size)[mine], cfg.micro_batch_size)
        ]
        reached, accepted, _ = profile_counts(probe(batches)[: M + 1], M)
        static_rates = AcceptanceProfile(reached, accepted).posterior_mean().tolist()

    # The log (rank 0), as it was at the checkpoint: the records of later steps go.
    metrics = None
    if dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        metrics = MetricsLog(out / METRICS, keep=_kept_log(state, out / METRICS))
    history: list[dict[str, Any]] = metrics.records if metrics is not None else []
    log = metrics.write if metrics is not None else history.append

    def save(path: Path, resumable: bool = True) -> Path:
        return _save(
            path,
            model,
            tokenizer,
            cfg,
            {
                "step": step,
                "tokens": tokens,
                "static_rates": static_rates,
                "cursor": stream.cursor,
                "tracker": tracker.state_dict(),
                "rng": rng_state(),
                "upcoming": upcoming,
                "metrics_bytes": metrics.size if metrics is not None else 0,
                "elapsed_s": time.monotonic() - t0,
                "world_size": dist.world,
            },
            dist,
            optimizer,
            resumable,
        )

    progress = Progress(
        TextColumn(f"proposal {cfg.data} {cfg.weights}/{cfg.profile}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} tokens"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        disable=not show_progress or dist.rank != 0,
    )
    t0 = time.monotonic() - state.get("elapsed_s", 0.0)  # a resumed run's clock goes on
    saved_at = step if start is not None else -1  # the step of the newest checkpoint on disk
    model.train()
    with progress:
        bar = progress.add_task("train", total=cfg.token_budget, completed=tokens, info="")
        while tokens < cfg.token_budget:
            # Stop between steps on SIGINT/SIGTERM, every rank at the same step: the flag is
            # all-reduced, the step reached is saved (by rank 0, or under FSDP by every rank),
            # rank 0 says so, the others end quietly once the save is done (torchrun tears
            # every rank down once one exits).
            if dist.any(stop.requested, device):
                err = Interrupted(f"at step {step}")
                here = out / f"checkpoint-{step:06d}"
                if cfg.fsdp and step > 0 and step != saved_at:
                    save(here)
                if metrics is not None:
                    err = interrupted_at(
                        step, f"{tokens:,}/{cfg.token_budget:,} tokens", here, save, metrics
                    )
                dist.barrier()
                raise err

            # Batch: this rank's rows of the global batch, in micro-batches laid out in blocks
            # of M. Every micro-batch is forwarded once: the step's loss is divided by the
            # global batch's label counts (known before any forward), and α and the profile its
            # weights come from are those measured up to the previous step (module docstring),
            # so the step is the same whatever the number of ranks and micro-batches.
            chunks = micro_batches(stream.take(cfg.batch_size)[mine], cfg.micro_batch_size)
            batches = [
                (rows, example_batch(cfg, rows, tokenizer, step, device, ids)) for rows in chunks
            ]
            lr = cfg.lr_at(tokens / cfg.token_budget)
            for group in optimizer.param_groups:
                group["lr"] = lr
            counts = dist.sum(torch.stack([label_counts(b) for _, b in batches]).sum(0))
            n_noisy, n_clean = max(float(counts[0]), 1.0), max(float(counts[1]), 1.0)
            if upcoming is None:  # the first step: α and the profile from a probe of its batch
                upcoming = upcoming_profile(ProfileTracker(M, cfg.profile_decay), probe(batches), M)
            rates = np.asarray(upcoming["rates"])
            if cfg.profile == "static" and static_rates is not None:
                rates = np.asarray(static_rates)
            a = upcoming["alpha"] if cfg.alpha == "auto" else float(cfg.alpha)

            # Step: each micro-batch's share of Σ w ℓ / n_noisy + α Σ ℓ_clean / n_clean, from
            # its one forward; gradients are reduced across ranks once, after the last.
            optimizer.zero_grad(set_to_none=True)
            local = torch.zeros(M + 1 + 4, dtype=torch.float64)  # histogram, loss totals
            weighted = torch.zeros((), dtype=torch.float64)
            slots = torch.zeros(2, M, dtype=torch.float64)
            for k, (rows, batch) in enumerate(batches):
                with grad_sync(net, k == len(batches) - 1):
                    losses, stats = measure(batch, rows)
                    token_w = token_weights(cfg, batch, losses.noisy.detach(), rates)
                    share = (token_w * losses.noisy).sum()
                    loss = dist.world * (share / n_noisy + a * losses.clean.sum() / n_clean)
                    loss.backward()
                local += stats
                weighted += share.detach().double().cpu()
                slots += slot_weight_sums(batch, token_w)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1

            # Profile and α for the next step: this batch's own proposals verified under the
            # ISD rule, folded into the tracker; the CE ratio of this batch.
            summed = dist.sum(torch.cat([local, slots.flatten(), weighted[None]]))
            reached, accepted, hist = profile_counts(summed[: M + 1], M)
            tracker.update(AcceptanceProfile(reached, accepted))
            plain_g, clean_g, _, _ = summed[M + 1 : M + 5].tolist()
            upcoming = {
                "rates": tracker.posterior_mean().tolist(),
                "alpha": auto_alpha(plain_g / n_noisy, clean_g / n_clean),
            }
            tokens += int(n_clean)
            counts_w = summed[M + 5 :]
            slot_counts, weight_sums = counts_w[:M], counts_w[M : 2 * M]
            ce_noisy = float(counts_w[-1]) / n_noisy
            loss_value = ce_noisy + a * clean_g / n_clean

            # Log: what the weights were computed from, and what they were.
            if step % cfg.log_every == 0 or tokens >= cfg.token_budget:
                record = {
                    "step": step,
                    "tokens": tokens,
                    "lr": lr,
                    "loss": loss_value,
                    "ce_noisy": ce_noisy,
                    "ce_noisy_plain": plain_g / n_noisy,
                    "ce_clean": clean_g / n_clean,
                    "alpha": a,
                    "weights": (weight_sums / slot_counts.clamp(min=1)).tolist(),
                    "profile": rates.tolist(),
                    "batch_reached": reached.tolist(),
                    "batch_accepted": accepted.tolist(),
                    "accept_hist": hist.tolist(),
                    "elapsed_s": time.monotonic() - t0,
                }
                log(record)
            progress.update(
                bar, completed=min(tokens, cfg.token_budget), info=f"loss {loss_value:.3f}"
            )
            due = cfg.save_every and step % cfg.save_every == 0 and tokens < cfg.token_budget
            if due and (dist.rank == 0 or cfg.fsdp):
                save(out / f"checkpoint-{step:06d}")
                saved_at = step

    wall = time.monotonic() - t0
    final = out / "final"
    if metrics is not None or cfg.fsdp:
        save(final, resumable=False)
    if metrics is not None:  # rank 0
        metrics.close()
        from brisk.runtime.train.plots import plot_weight_evolution

        plot_weight_evolution(metrics.path, out / "weights.png")
    dist.barrier()
    return ProposalResult(final, history, step, tokens, wall)
