"""Verifier-distilled corrector training (``brisk train corrector``), appendix eq. 6.

The backbone is frozen (and so are its input embedding E and LM head E_out, which the head
reads); only the head's own FP32 parameters train. For every event e (a policy-reached block of
the deployed decoder, :mod:`~brisk.runtime.train.corrector_events`) and proposal position j:

    r_ej   = softmax(ℓ̃_ej)                      the head's refined law over C_ej, teacher-forced
                                                  on the base's recorded block (x_{j−1} is the
                                                  base's choice, whatever the head would pick)
    p_S,ej = p_ej(C) / Σ_C p_ej                  the verifier under the recorded prefix,
                                                  restricted to and renormalized over C_ej
    q_S,ej = softmax(ℓ_ej)                        the base proposal over C_ej
    ℓ_ej   = CE(p_S,ej, r_ej) + β · KL(q_S,ej ‖ r_ej)
    L_head = Σ m_ej ℓ_ej / Σ m_ej                 (eq:head_training_loss)

with m_ej = 1 on the accepted prefix and the first rejected position (all M positions of an
all-pass block), 0 after the first rejection: one global mean over reached positions, uniform
position weights. (A reached position whose candidates carry no verifier mass at all has no
target and is left out.) The ``top1`` ablation replaces p_S by the one-hot of its argmax.

Outputs under ``out_dir``: ``metrics.jsonl`` (train records every ``log_every`` steps,
validation records on held-out requests), ``checkpoint-<step>/`` and ``final/`` — each a
:meth:`Corrector.save_pretrained` directory plus ``train_config.json``, written to a temporary
directory and renamed into place. A checkpoint also holds ``trainer_state.pt`` (optimizer, step,
the epoch's event order and its generator, the global RNG states, the size of
``metrics.jsonl``): SIGINT or SIGTERM stops training between steps with a checkpoint of the step
reached, and ``resume`` continues from the newest one to the head an uninterrupted run ends with,
bit for bit on CPU (:mod:`brisk.runtime.train.resume` has the rules of a run directory).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from brisk._interrupt import stop_signals
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.train.corrector_config import CorrectorTrainConfig
from brisk.runtime.train.event_store import EventStore
from brisk.runtime.train.resume import (
    METRICS,
    STATE,
    MetricsLog,
    config_changes,
    interrupted_at,
    load_state,
    restore_rng,
    rng_state,
    start_checkpoint,
)

if TYPE_CHECKING:
    from brisk.runtime.backbone import Backbone

__all__ = ["EventBatch", "HeadLoss", "TrainResult", "event_batch", "head_loss", "train_corrector"]


@dataclass(frozen=True)
class HeadLoss:
    loss: Tensor  # [] the global mean over reached positions
    ce: Tensor  # [] mean CE(p_S, r) over reached positions
    kl: Tensor  # [] mean KL(q_S ‖ r) over reached positions
    positions: int  # Σ m


def head_loss(refined: Tensor, target: Tensor, q: Tensor, mask: Tensor, beta: float) -> HeadLoss:
    """eq:head_training_loss: refined logits, targets, base laws ``[B, M, K]``; mask ``[B, M]``.

    ``target`` and ``q`` rows are distributions over the candidates (anything finite where the
    mask is 0: those positions get zero weight and zero gradient).
    """
    log_r = torch.log_softmax(refined.float(), dim=-1)
    m = mask.to(log_r.dtype)
    ce = -(target * log_r).sum(-1)  # [B, M]
    kl = (torch.xlogy(q, q) - q * log_r).sum(-1)  # Σ q log q − Σ q log r, 0 log 0 = 0
    n = m.sum()
    denom = n.clamp(min=1.0)
    mean_ce, mean_kl = (ce * m).sum() / denom, (kl * m).sum() / denom
    return HeadLoss(mean_ce + beta * mean_kl, mean_ce, mean_kl, int(n))


@dataclass(frozen=True)
class EventBatch:
    """The head's inputs and targets for some events, at the head's K (tensors)."""

    anchor_hidden: Tensor  # [B, H]
    anchor: Tensor  # [B]
    mask_hidden: Tensor  # [B, M, H]
    cand_logits: Tensor  # [B, M, K]
    cand_ids: Tensor  # [B, M, K]
    tokens: Tensor  # [B, M] the base's recorded block (teacher forcing)
    target: Tensor  # [B, M, K] p_S (or its one-hot top-1); 0 where masked out
    q: Tensor  # [B, M, K] q_S
    mask: Tensor  # [B, M] bool, reached positions with a target

    def to(self, device: torch.device | str) -> EventBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)}
        return EventBatch(**moved)

    def loss(self, head: Corrector, backbone: Backbone, beta: float) -> tuple[HeadLoss, Tensor]:
        refined = head(
            backbone,
            self.anchor_hidden,
            self.anchor,
            self.mask_hidden,
            self.cand_logits,
            self.cand_ids,
            self.tokens,
        )
        return head_loss(refined, self.target, self.q, self.mask, beta), refined


def event_batch(
    store: EventStore,
    index: np.ndarray,
    K: int,
    target: str = "verifier",
    device: torch.device | str = "cpu",
) -> EventBatch:
    """Events ``index`` of ``store`` for a head of ``K`` ≤ ``store.K`` candidates, on
    ``device``."""
    if K > store.K:
        raise ValueError(f"K: {K} candidates, but {store.path} holds only K = {store.K}")
    index = np.sort(np.asarray(index))  # memmap reads in file order
    M = store.M
    full_ids = store.cand_ids[index]  # [B, M, K_store]
    tokens = np.take_along_axis(full_ids, store.base_choice[index][..., None], -1)[..., 0]
    p = np.nan_to_num(store.p[index, :, :K].astype(np.float64), nan=0.0)
    reached = np.arange(M)[None] <= store.accept_len[index][:, None]
    mass = p.sum(-1)
    mask = reached & (mass > 0)
    if target == "verifier":
        tgt = np.where(mask[..., None], p / np.maximum(mass, 1e-300)[..., None], 0.0)
    elif target == "top1":
        tgt = np.eye(K)[p.argmax(-1)] * mask[..., None]
    else:
        raise ValueError(f"target: expected verifier or top1, got {target!r}")
    logits = torch.from_numpy(np.asarray(store.cand_logits[index, :, :K], np.float32))
    return EventBatch(
        anchor_hidden=torch.from_numpy(np.asarray(store.anchor_hidden[index], np.float32)),
        anchor=torch.from_numpy(store.anchor[index]),
        mask_hidden=torch.from_numpy(np.asarray(store.mask_hidden[index], np.float32)),
        cand_logits=logits,
        cand_ids=torch.from_numpy(np.ascontiguousarray(full_ids[:, :, :K])),
        tokens=torch.from_numpy(tokens),
        target=torch.from_numpy(tgt.astype(np.float32)),
        q=torch.softmax(logits, dim=-1),
        mask=torch.from_numpy(mask),
    ).to(device)


@dataclass(frozen=True)
class TrainResult:
    checkpoint: Path  # final/
    steps: int
    train_events: int
    val_events: int
    val_loss: float  # held-out loss of the final head
    val_loss_init: float  # held-out loss of the untrained (identity) head
    wall_s: float


def split_requests(store: EventStore, cfg: CorrectorTrainConfig) -> tuple[np.ndarray, np.ndarray]:
    """Event indices for training and validation: whole requests are held out, so no response
    contributes to both (its blocks are correlated)."""
    keep = store.correct if cfg.only_correct else np.ones(len(store), bool)
    requests = np.unique(store.request_id[keep])
    if len(requests) < 2:
        raise ValueError(
            f"{store.path}: {len(requests)} usable request(s)"
            + (" graded correct" if cfg.only_correct else "")
            + "; need at least 2 (one for validation)"
        )
    rng = np.random.default_rng(10_007 + cfg.seed)
    n_val = min(max(1, round(cfg.val_fraction * len(requests))), len(requests) - 1)
    val = rng.choice(requests, n_val, replace=False)
    is_val = np.isin(store.request_id, val)
    return np.flatnonzero(keep & ~is_val), np.flatnonzero(keep & is_val)


def head_config(
    backbone: Backbone, store: EventStore, cfg: CorrectorTrainConfig
) -> CorrectorConfig:
    if cfg.head == "paper":
        return CorrectorConfig.for_backbone(
            backbone, M=store.M, K=cfg.K, prefix_feedback=cfg.feedback
        )
    small = CorrectorConfig.small(backbone.hidden_size, backbone.vocab_size, M=store.M, K=cfg.K)
    return dataclasses.replace(small, prefix_feedback=cfg.feedback)


@torch.no_grad()
def validation(
    head: Corrector,
    backbone: Backbone,
    store: EventStore,
    index: np.ndarray,
    cfg: CorrectorTrainConfig,
    chunk: int = 1024,
) -> dict[str, float]:
    """Held-out loss (its CE and KL parts) and top-1 agreement with the verifier over C."""
    totals = {"loss": 0.0, "ce": 0.0, "kl": 0.0, "agree": 0.0, "base_agree": 0.0}
    n = 0
    for lo in range(0, len(index), chunk):
        batch = event_batch(store, index[lo : lo + chunk], cfg.K, cfg.target, backbone.device)
        out, refined = batch.loss(head, backbone, cfg.beta)
        k = out.positions
        verifier = batch.target.argmax(-1)
        m = batch.mask
        totals["loss"] += float(out.loss) * k
        totals["ce"] += float(out.ce) * k
        totals["kl"] += float(out.kl) * k
        totals["agree"] += float(((refined.argmax(-1) == verifier) & m).sum())
        totals["base_agree"] += float(((verifier == 0) & m).sum())
        n += k
    return {f"val_{k}": v / max(n, 1) for k, v in totals.items()} | {"val_positions": n}


def _save(
    head: Corrector, cfg: CorrectorTrainConfig, path: Path, state: dict[str, Any] | None = None
) -> Path:
    from brisk._atomic import building_dir

    with building_dir(path) as tmp:
        head.save_pretrained(tmp)
        (tmp / "train_config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        if state is not None:
            torch.save(state, tmp / STATE)
    return path


def load_backbone(
    store: EventStore,
    checkpoint: str | Path | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    mask_token_id: int | None = None,
) -> Backbone:
    """The store's frozen backbone (its recorded checkpoint unless another is given), checked
    against the store's sizes and, when recorded, its checkpoint hash; on ``device`` in
    ``dtype``, with the MASK id ``mask_token_id``, else the one the store was collected with
    (``--mask-token-id`` of the collection), else its own
    (:func:`brisk.runtime.loader.load_model`). A store of speculative decoding gets
    its AR target's E and E_out (:class:`~brisk.runtime.backbone.ModelHeads`), in float32:
    what the head reads of it."""
    from brisk.runtime.loader import load_model, placement
    from brisk.runtime.train.selfgen import checkpoint_hash

    path = Path(checkpoint or store.meta.get("checkpoint", ""))
    if not (path / "config.json").is_file():
        raise ValueError(
            f"backbone: {path} is not a checkpoint (the store's recorded backbone "
            "must exist, or pass one)"
        )
    if mask_token_id is None:
        mask_token_id = store.meta.get("options", {}).get("mask_token_id")
    expected = store.meta.get("checkpoint_hash")
    if expected is not None and checkpoint_hash(path) != expected:
        raise ValueError(
            f"backbone: {path} is not the checkpoint {store.path} was collected from "
            f"(hash {checkpoint_hash(path)} ≠ {expected})"
        )
    if store.meta.get("decoder", {}).get("algorithm") == "speculative":
        from brisk.runtime.drafter import target_heads
        from brisk.runtime.train.drafter_loop import load_target

        if dtype not in (None, "", "auto", "float32"):
            raise ValueError(f"dtype: a drafter's target is read in float32, got {dtype}")
        where = placement(device, "float32").device
        target, _, _ = load_target(path, "backbone", where, mask_token_id)
        heads = target_heads(target)  # its vocabulary: the LM head's rows
        store.check_backbone(heads)  # type: ignore[arg-type]
        return heads  # type: ignore[return-value]
    backbone = load_model(
        path, device=device, dtype=dtype, mask_token_id=mask_token_id, where="backbone"
    ).backbone
    backbone.model.requires_grad_(False)
    store.check_backbone(backbone)
    return backbone


def train_corrector(
    cfg: CorrectorTrainConfig,
    show_progress: bool = True,
    backbone: Backbone | None = None,
    store: EventStore | None = None,
    *,
    resume: bool = True,
) -> TrainResult:
    """Train a head on ``cfg.events`` (module docstring); ``backbone`` / ``store`` may be passed
    in already loaded (tests, experiments). With ``resume`` (the library's default, which the
    experiments rely on) an interrupted run in ``cfg.out_dir`` is continued, else a directory
    holding a run is refused (:func:`~brisk.runtime.train.resume.start_checkpoint`). SIGINT or
    SIGTERM ends it between steps with a checkpoint and :class:`~brisk._interrupt.Interrupted`."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from safetensors.torch import load_file

    from brisk.runtime.train.common import cpu_settings

    if store is None:
        if not cfg.events:
            raise ValueError("events: corrector training needs an event store")
        store = EventStore.open(cfg.events)
    if cfg.K > store.K:
        raise ValueError(f"K: {cfg.K} candidates, but {store.path} holds only K = {store.K}")
    if backbone is None:
        backbone = load_backbone(
            store, device=cfg.device, dtype=cfg.dtype, mask_token_id=cfg.mask_token_id
        )
    store.check_backbone(backbone)
    out = Path(cfg.out_dir)
    begin = start_checkpoint(out, resume, cfg)
    out.mkdir(parents=True, exist_ok=True)
    train_idx, val_idx = split_requests(store, cfg)
    with cpu_settings(cfg.threads), stop_signals() as stop:
        torch.manual_seed(cfg.seed)
        head = Corrector(head_config(backbone, store, cfg)).float().to(backbone.device)
        optimizer = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        rng = np.random.default_rng(cfg.seed)  # each epoch's order of the training events
        per_epoch = math.ceil(len(train_idx) / cfg.batch_size)
        total = per_epoch * cfg.epochs
        eval_every = cfg.eval_every or per_epoch

        # Resume: head, optimizer, RNG states, the epoch's order and the log as they were at
        # the checkpoint; a new run starts with the untrained head's held-out loss.
        state = load_state(begin) if begin is not None else {}
        store_id = {k: v for k, v in store.meta.items() if k != "checkpoint"}
        changes = config_changes(state["store"], store_id) if begin is not None else []
        if changes:
            raise ValueError(
                f"--resume: {begin} was trained on another event store than "
                f"{store.path} ({'; '.join(changes)})"
            )
        metrics = MetricsLog(out / METRICS, keep=state.get("metrics_bytes", 0))
        if begin is not None:
            head.load_state_dict(load_file(begin / "model.safetensors"))
            optimizer.load_state_dict(state["optimizer"])
            rng.bit_generator.state = state["order_rng"]
            restore_rng(state["rng"])
            step, order, init, last = state["step"], state["order"], state["init"], state["last"]
        else:
            step, order = 0, train_idx
            init = last = validation(head, backbone, store, val_idx, cfg)
            metrics.write({"step": 0, **init})
        start = time.perf_counter() - state.get("elapsed_s", 0.0)

        def save(path: Path) -> Path:
            return _save(
                head,
                cfg,
                path,
                {
                    "step": step,
                    "store": store_id,
                    "optimizer": optimizer.state_dict(),
                    "order": order,
                    "order_rng": rng.bit_generator.state,
                    "rng": rng_state(),
                    "init": init,
                    "last": last,
                    "metrics_bytes": metrics.size,
                    "elapsed_s": time.perf_counter() - start,
                },
            )

        columns = (
            TextColumn("corrector"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, disable=not show_progress) as progress:
            bar = progress.add_task("train", total=total, completed=step, loss=float("nan"))
            while step < total:
                # Stop between steps on SIGINT/SIGTERM, with a checkpoint of the step reached.
                if stop.requested:
                    raise interrupted_at(step, total, out / f"checkpoint-{step:06d}", save, metrics)
                epoch, k = divmod(step, per_epoch)
                if k == 0:
                    order = rng.permutation(train_idx)
                lo = k * cfg.batch_size
                batch = event_batch(
                    store, order[lo : lo + cfg.batch_size], cfg.K, cfg.target, backbone.device
                )
                loss, _ = batch.loss(head, backbone, cfg.beta)
                optimizer.zero_grad(set_to_none=True)
                loss.loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
                optimizer.step()
                step += 1
                progress.update(bar, advance=1, loss=float(loss.loss.detach()))
                if step % cfg.log_every == 0 or step == total:
                    metrics.write(
                        {
                            "step": step,
                            "epoch": epoch,
                            "loss": float(loss.loss.detach()),
                            "ce": float(loss.ce.detach()),
                            "kl": float(loss.kl.detach()),
                            "positions": loss.positions,
                            "grad_norm": float(grad_norm),
                            "gate": float(torch.sigmoid(head.alpha.detach())),
                        }
                    )
                if step % eval_every == 0 or step == total:
                    last = validation(head, backbone, store, val_idx, cfg)
                    metrics.write({"step": step, "epoch": epoch, **last})
                if cfg.save_every and step % cfg.save_every == 0:
                    save(out / f"checkpoint-{step:06d}")
        metrics.close()
        final = _save(head, cfg, out / "final")
    return TrainResult(
        final,
        step,
        len(train_idx),
        len(val_idx),
        last["val_loss"],
        init["val_loss"],
        time.perf_counter() - start,
    )
