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

One loop, read top to bottom. Under ``torchrun --nproc-per-node P`` (gloo on CPU, nccl on GPU)
every rank takes rows ``rank::P`` of the same global batch and the model is wrapped in DDP; the
loss is divided by the *global* token counts (all-reduced), the acceptance counts are
all-reduced, so every rank uses the same weights and the run matches a single process at the
same global batch up to float summation order. Rank 0 writes ``metrics.jsonl`` (one record per
step: weights, profile, losses), checkpoints and ``weights.png``.

Checkpoints (``checkpoint-NNNNNN/`` every ``save_every`` steps and ``final/``) hold the model
(safetensors + HF config), tokenizer, the base run's ``train_config.json``, this run's
``proposal_config.json`` and ``trainer_state.pt`` (optimizer, step, tokens seen, data cursor,
profile tracker, RNG states, the size of ``metrics.jsonl``); each is written to a temporary
directory and renamed. SIGINT or SIGTERM stops the run between steps with a checkpoint of the
step it reached; under torchrun the ranks all-reduce their stop flag at every step, so all stop
at the same step, rank 0 saves while the others wait. ``resume`` continues from the newest
checkpoint and ends bit-identical to an uninterrupted run on CPU; the rules of a run directory
(a used one is refused without ``resume``, another configuration is named) are those of
:mod:`brisk.runtime.train.resume`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from brisk._interrupt import Interrupted, StopSignals, stop_signals
from brisk.runtime.train.acceptance import (
    BlockAcceptance,
    block_acceptance,
    position_weights,
    slot_table,
)
from brisk.runtime.train.base import cpu_settings, replace_dir
from brisk.runtime.train.evaluate import encode_example
from brisk.runtime.train.flex import set_attention, training_forward
from brisk.runtime.train.idlm import IGNORE, IDLMBatch, build_batch
from brisk.runtime.train.proposal_config import ProposalTrainConfig
from brisk.runtime.train.proposal_data import Example, ExampleStream, load_examples
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
from brisk.theory import AcceptanceProfile, ProfileTracker

__all__ = ["ProposalResult", "latest_checkpoint", "train_proposal", "weighted_loss"]


@dataclass(frozen=True)
class ProposalResult:
    checkpoint: Path  # final/
    history: list[dict[str, Any]]  # rank 0: every record of metrics.jsonl; others: their own
    steps: int
    tokens: int
    wall_s: float


@dataclass(frozen=True)
class _Dist:
    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> _Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), world)

    def sum(self, values: Tensor) -> Tensor:
        """All-reduced sum (a no-op in a single process)."""
        if self.world > 1:
            import torch.distributed as dist

            values = values.clone()
            dist.all_reduce(values)
        return values

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` holds on some rank: one all-reduce, on ``device`` (nccl needs the
        GPU)."""
        if self.world == 1:
            return flag
        return bool(self.sum(torch.tensor([float(flag)], device=device)).item() > 0)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def weighted_loss(
    noisy_logits: Tensor,
    clean_logits: Tensor,
    batch: IDLMBatch,
    token_weights: Tensor,
    alpha: float | str = "auto",
    dist: _Dist | None = None,
) -> dict[str, Tensor | float]:
    """The weighted I-DLM loss (module docstring). ``token_weights [B, L]`` multiply the MASK
    slots' cross-entropies; denominators are global token counts under ``dist``. Returns the
    local loss to backpropagate (scaled by the world size, as DDP averages gradients) and the
    global figures to log."""
    dist = dist or _Dist()
    ce_noisy = F.cross_entropy(noisy_logits.float().transpose(1, 2), batch.noisy_labels,
                               ignore_index=IGNORE, reduction="none")  # fmt: skip
    ce_clean = F.cross_entropy(clean_logits.float().transpose(1, 2), batch.clean_labels,
                               ignore_index=IGNORE, reduction="none")  # fmt: skip
    weighted = (token_weights * ce_noisy).sum()
    clean = ce_clean.sum()
    n_noisy_local = (batch.noisy_labels != IGNORE).sum()
    n_clean_local = (batch.clean_labels != IGNORE).sum()
    local = torch.stack([ce_noisy.detach().sum(), clean.detach(), weighted.detach(),
                         n_noisy_local.float(), n_clean_local.float()]).double()  # fmt: skip
    plain_g, clean_g, weighted_g, n_noisy, n_clean = dist.sum(local).tolist()
    n_noisy, n_clean = max(n_noisy, 1.0), max(n_clean, 1.0)
    a = plain_g / n_noisy / max(clean_g / n_clean, 1e-8) if alpha == "auto" else float(alpha)
    loss = dist.world * (weighted / n_noisy + a * clean / n_clean)
    return {
        "loss": loss,
        "loss_value": weighted_g / n_noisy + a * clean_g / n_clean,
        "ce_noisy": weighted_g / n_noisy,
        "ce_noisy_plain": plain_g / n_noisy,
        "ce_clean": clean_g / n_clean,
        "alpha": a,
        "tokens": n_clean,
    }


def _encode(rows: list[tuple[int, Example]], tokenizer: Any) -> tuple[list[list[int]], list[int]]:
    encoded = [encode_example(ex.prompt, ex.response, tokenizer) for _, ex in rows]
    return [s for s, _ in encoded], [n for _, n in encoded]


def _batch(cfg: ProposalTrainConfig, rows: list[tuple[int, Example]], tokenizer: Any, step: int,
           device: torch.device, ids: tuple[int, int]) -> IDLMBatch:  # fmt: skip
    seqs, prompt_lens = _encode(rows, tokenizer)
    M = cfg.M
    offset = (
        random.Random(f"{cfg.seed}:offset:{step}").randrange(M) if cfg.random_block_offset else 0
    )
    mask_id, pad_id = ids
    return build_batch(seqs, prompt_lens, M, mask_id, pad_id, offset=offset, device=device,
                       dense_mask=cfg.attention == "dense")  # fmt: skip


def _profile_counts(acc: BlockAcceptance, M: int, dist: _Dist) -> tuple[np.ndarray, np.ndarray,
                                                                         np.ndarray]:  # fmt: skip
    """Global reached/accepted counts [M] and the accept-length histogram [M + 1]."""
    hist = torch.bincount(acc.accept_len, minlength=M + 1).double()
    hist = dist.sum(hist).long().numpy()
    p = AcceptanceProfile.from_accept_lengths(np.repeat(np.arange(M + 1), hist), M)
    return p.reached, p.accepted, hist


def _save(path: Path, model: Any, tokenizer: Any, cfg: ProposalTrainConfig,
          state: dict[str, Any]) -> Path:  # fmt: skip
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    world = Path(cfg.init) / "train_config.json"  # a brisk base's world travels with it
    if world.is_file():
        shutil.copy(world, tmp / "train_config.json")
    (tmp / "proposal_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    torch.save(state, tmp / STATE)
    return replace_dir(tmp, path)


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
    from transformers import AutoTokenizer

    from brisk.runtime.architectures import load_causal_lm, training_token_ids

    dist = _Dist.from_env()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available()
                          else "cpu")  # fmt: skip
    out, M = Path(cfg.out_dir), cfg.M
    examples = load_examples(cfg)
    tokenizer = AutoTokenizer.from_pretrained(cfg.init, local_files_only=True)

    # Where to start: the init checkpoint, or the newest checkpoint of this run. Every rank
    # reads the directory before rank 0 writes to it.
    start = start_checkpoint(out, resume, cfg.to_dict(), "proposal_config.json")
    dist.barrier()
    torch.manual_seed(cfg.seed)
    model = load_causal_lm(start or cfg.init, False, torch.float32).to(device)
    ids = training_token_ids(tokenizer, model.config, f"--init: {cfg.init}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98),
    )  # fmt: skip
    tracker = ProfileTracker(M, cfg.profile_decay)
    step, tokens, static_rates = 0, 0, None
    stream = ExampleStream(examples, cfg.seed)
    state = load_state(start) if start is not None else {}
    if start is not None:
        optimizer.load_state_dict(state["optimizer"])
        step, tokens, static_rates = state["step"], state["tokens"], state["static_rates"]
        stream = ExampleStream(examples, cfg.seed, **state["cursor"])
        tracker.load_state_dict(state["tracker"])
        restore_rng(state["rng"])
    set_attention(model, cfg.attention)  # not saved with the model: checkpoints stay plain
    net: Any = model
    if dist.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)

    # Static profile: the initial model's acceptance on a few batches of the training data.
    if cfg.weights == "brisk" and cfg.profile == "static" and static_rates is None:
        probe = ExampleStream(examples, cfg.seed + 1)
        reached, accepted = np.zeros(M, np.int64), np.zeros(M, np.int64)
        with torch.no_grad():
            for k in range(cfg.static_batches):
                rows = probe.take(cfg.batch_size)[dist.rank :: dist.world]
                batch = _batch(cfg, rows, tokenizer, -1 - k, device, ids)
                noisy, clean = training_forward(model, batch, cfg.attention)
                acc = block_acceptance(noisy, clean, slot_table(batch),
                                       torch.tensor([i for i, _ in rows]), cfg.seed,
                                       cfg.temperature, cfg.top_k)  # fmt: skip
                r, a, _ = _profile_counts(acc, M, dist)
                reached, accepted = reached + r, accepted + a
        static_rates = AcceptanceProfile(reached, accepted).posterior_mean().tolist()

    # The log (rank 0), as it was at the checkpoint: the records of later steps go.
    metrics = None
    if dist.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        metrics = MetricsLog(out / METRICS, keep=_kept_log(state, out / METRICS))
    history: list[dict[str, Any]] = metrics.records if metrics is not None else []
    log = metrics.write if metrics is not None else history.append

    def save(path: Path) -> Path:
        return _save(path, model, tokenizer, cfg, {
            "optimizer": optimizer.state_dict(), "step": step, "tokens": tokens,
            "static_rates": static_rates, "cursor": stream.cursor,
            "tracker": tracker.state_dict(), "rng": rng_state(),
            "metrics_bytes": metrics.size if metrics is not None else 0,
            "elapsed_s": time.monotonic() - t0,
        })  # fmt: skip

    progress = Progress(
        TextColumn(f"proposal {cfg.data} {cfg.weights}/{cfg.profile}"), BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} tokens"),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
        disable=not show_progress or dist.rank != 0,
    )  # fmt: skip
    t0 = time.monotonic() - state.get("elapsed_s", 0.0)  # a resumed run's clock goes on
    model.train()
    with progress:
        bar = progress.add_task("train", total=cfg.token_budget, completed=tokens, info="")
        while tokens < cfg.token_budget:
            # Stop between steps on SIGINT/SIGTERM, every rank at the same step: the flag is
            # all-reduced, rank 0 saves the step reached and says so, the others wait for the
            # save (torchrun tears every rank down once one exits) and end quietly.
            if dist.any(stop.requested, device):
                err = Interrupted(f"at step {step}")
                if metrics is not None:
                    err = interrupted_at(step, f"{tokens:,}/{cfg.token_budget:,} tokens",
                                         out / f"checkpoint-{step:06d}", save, metrics)  # fmt: skip
                dist.barrier()
                raise err

            # Batch: this rank's rows of the global batch, laid out in blocks of M.
            rows = stream.take(cfg.batch_size)[dist.rank :: dist.world]
            batch = _batch(cfg, rows, tokenizer, step, device, ids)
            lr = cfg.lr_at(tokens / cfg.token_budget)
            for group in optimizer.param_groups:
                group["lr"] = lr
            noisy, clean = training_forward(net, batch, cfg.attention)

            # Profile: the batch's own proposals verified under the ISD rule, counts summed
            # over ranks, folded into the tracker.
            table = slot_table(batch)
            acc = block_acceptance(noisy.detach(), clean.detach(), table,
                                   torch.tensor([i for i, _ in rows]), cfg.seed,
                                   cfg.temperature, cfg.top_k)  # fmt: skip
            reached, accepted, hist = _profile_counts(acc, M, dist)
            tracker.update(AcceptanceProfile(reached, accepted))
            rates = tracker.posterior_mean()
            if cfg.profile == "static" and static_rates is not None:
                rates = np.asarray(static_rates)

            # Weights (constants): one row [1, M] shared by every block, or D-PACE's per block.
            target_probs = None
            if cfg.weights == "dpace":
                logp = torch.log_softmax(noisy.detach().float(), -1)
                lab = batch.noisy_labels.clamp(min=0)
                tok_p = logp.gather(-1, lab[..., None])[..., 0].exp()  # [B, L]
                idx = table.index.clamp(min=0)
                target_probs = torch.where(table.index >= 0, tok_p.gather(1, idx.flatten(1))
                                           .view_as(idx), 1.0)  # fmt: skip
            w = position_weights(cfg.weights, M, rates=rates, target_probs=target_probs,
                                 gamma=cfg.gamma)  # fmt: skip
            block_w = w.to(device).expand(*table.index.shape)  # [B, K, M]
            token_w = torch.zeros(batch.noisy_labels.shape, device=device)
            valid = table.index >= 0
            token_w.scatter_(1, table.index.clamp(min=0).flatten(1),
                             torch.where(valid, block_w, 0.0).flatten(1))  # fmt: skip
            token_w = torch.where(batch.noisy_labels != IGNORE, token_w, 0.0)

            # Step: weighted I-DLM loss over global token counts; DDP averages the gradients.
            out_loss = weighted_loss(noisy, clean, batch, token_w, cfg.alpha, dist)
            optimizer.zero_grad(set_to_none=True)
            out_loss["loss"].backward()  # type: ignore[union-attr]
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1
            tokens += int(out_loss["tokens"])

            # Log: what the weights were computed from, and what they were.
            if step % cfg.log_every == 0 or tokens >= cfg.token_budget:
                slot = batch.slot.expand_as(token_w)
                lab = batch.noisy_labels != IGNORE
                counts = dist.sum(
                    torch.zeros(M, dtype=torch.float64).index_add_(
                        0, slot[lab].cpu(), torch.ones(int(lab.sum()), dtype=torch.float64)
                    )
                )
                mean_w = dist.sum(
                    torch.zeros(M, dtype=torch.float64).index_add_(
                        0, slot[lab].cpu(), token_w[lab].double().cpu()
                    )
                ) / counts.clamp(min=1)
                record = {
                    "step": step, "tokens": tokens, "lr": lr,
                    "loss": out_loss["loss_value"], "ce_noisy": out_loss["ce_noisy"],
                    "ce_noisy_plain": out_loss["ce_noisy_plain"],
                    "ce_clean": out_loss["ce_clean"], "alpha": out_loss["alpha"],
                    "weights": mean_w.tolist(), "profile": rates.tolist(),
                    "batch_reached": reached.tolist(), "batch_accepted": accepted.tolist(),
                    "accept_hist": hist.tolist(), "elapsed_s": time.monotonic() - t0,
                }  # fmt: skip
                log(record)
            progress.update(bar, completed=min(tokens, cfg.token_budget),
                            info=f"loss {out_loss['loss_value']:.3f}")  # fmt: skip
            due = cfg.save_every and step % cfg.save_every == 0 and tokens < cfg.token_budget
            if due and dist.rank == 0:
                save(out / f"checkpoint-{step:06d}")

    wall = time.monotonic() - t0
    final = out / "final"
    if metrics is not None:  # rank 0
        save(final)
        metrics.close()
        from brisk.runtime.train.plots import plot_weight_evolution

        plot_weight_evolution(metrics.path, out / "weights.png")
    dist.barrier()
    return ProposalResult(final, history, step, tokens, wall)
