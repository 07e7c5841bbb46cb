"""Verifier-distilled corrector training (``brisk train corrector``), appendix eq. 6.

The backbone is frozen (and so are its input embedding E and LM head E_out, which the head
reads); only the head's own FP32 parameters train. For every event e (a policy-reached block of
the deployed decoder, :mod:`~brisk.runtime.train.corrector.events`) and proposal position j:

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor

from brisk.runtime.corrector import Corrector, CorrectorConfig, CorrectorInputs
from brisk.runtime.train.corrector.config import CorrectorTrainConfig
from brisk.runtime.train.corrector.store import EventStore
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train
from brisk.runtime.train.resume import config_changes

if TYPE_CHECKING:
    from brisk.runtime.backbone import Backbone

__all__ = [
    "CorrectorRecipe",
    "EventBatch",
    "HeadFit",
    "HeadLoss",
    "corrector_recipe",
    "event_batch",
    "head_loss",
    "train_corrector",
]


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
        inputs = CorrectorInputs(
            self.anchor_hidden, self.anchor, self.mask_hidden, self.cand_logits, self.cand_ids
        )
        refined = head(backbone, inputs, self.tokens)
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
class HeadFit:
    """A corrector run's outcome: its events and the held-out loss before and after."""

    train_events: int
    val_events: int
    val_loss: float  # held-out loss of the final head
    val_loss_init: float  # held-out loss of the untrained (identity) head


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
        from brisk.runtime.loader import load_target

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
) -> TrainResult[HeadFit]:
    """Train a head on ``cfg.events`` (module docstring) through the harness
    (:func:`~brisk.runtime.train.harness.train`: resume by default, SIGINT or SIGTERM ends it
    between steps with a checkpoint); ``backbone`` / ``store`` may be passed in already loaded
    (tests, experiments)."""
    return train(corrector_recipe(cfg, backbone, store), show_progress, resume=resume)


def corrector_recipe(
    cfg: CorrectorTrainConfig, backbone: Backbone | None = None, store: EventStore | None = None
) -> CorrectorRecipe:
    """The recipe on ``cfg.events`` (or ``store``) and the store's backbone (or ``backbone``),
    both checked against each other and ``cfg``."""
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
    return CorrectorRecipe(cfg, backbone, store)


class CorrectorRecipe(Recipe[CorrectorTrainConfig, HeadFit]):
    """The head on the store's events, epoch after epoch in a shuffled order, the backbone
    frozen; validated on held-out requests every ``eval_every`` steps (module docstring)."""

    label = "corrector"

    def __init__(self, cfg: CorrectorTrainConfig, backbone: Backbone, store: EventStore) -> None:
        super().__init__(cfg)
        self.backbone, self.store = backbone, store
        self.train_idx, self.val_idx = split_requests(store, cfg)
        self.per_epoch = math.ceil(len(self.train_idx) / cfg.batch_size)
        self.rng = np.random.default_rng(cfg.seed)  # each epoch's order of the training events
        self.order = self.train_idx
        self.store_id = {k: v for k, v in store.meta.items() if k != "checkpoint"}

    @property
    def total(self) -> int:
        return self.per_epoch * self.cfg.epochs

    def build(self, run: Run) -> None:
        config = head_config(self.backbone, self.store, self.cfg)
        self.model = Corrector(config).float().to(self.backbone.device)
        if run.start is not None:
            self.model.load_state_dict(load_file(run.start / "model.safetensors"))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "store": self.store_id,
            "order": self.order,
            "order_rng": self.rng.bit_generator.state,
            "init": self.init,
            "last": self.last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        changes = config_changes(state["store"], self.store_id)
        if changes:
            raise ValueError(
                f"--resume: {self.cfg.out_dir} was trained on another event store than "
                f"{self.store.path} ({'; '.join(changes)})"
            )
        self.rng.bit_generator.state = state["order_rng"]
        self.order, self.init, self.last = state["order"], state["init"], state["last"]

    def validate(self) -> dict[str, float]:
        return validation(self.model, self.backbone, self.store, self.val_idx, self.cfg)

    def begin(self, run: Run) -> None:
        if run.start is None:  # a new run starts with the untrained head's held-out loss
            self.init = self.last = self.validate()
            run.log({"event": "eval", "step": 0, **self.init})

    def step(self, run: Run, step: int) -> StepRecord:
        cfg = self.cfg
        epoch, k = divmod(step, self.per_epoch)
        if k == 0:
            self.order = self.rng.permutation(self.train_idx)
        lo = k * cfg.batch_size
        index = self.order[lo : lo + cfg.batch_size]
        batch = event_batch(self.store, index, cfg.K, cfg.target, self.backbone.device)
        loss, _ = batch.loss(self.model, self.backbone, cfg.beta)
        self.optimizer.zero_grad(set_to_none=True)
        loss.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        value = float(loss.loss.detach())
        fields = {
            "epoch": epoch,
            "loss": value,
            "ce": float(loss.ce.detach()),
            "kl": float(loss.kl.detach()),
            "positions": loss.positions,
            "grad_norm": float(grad_norm),
            "gate": float(torch.sigmoid(self.model.alpha.detach())),
        }
        return StepRecord(fields, f"loss {value:.4f}")

    def evaluate(self, run: Run, done: int, finished: bool) -> None:
        if done % (self.cfg.eval_every or self.per_epoch) == 0 or finished:
            self.last = self.validate()
            epoch = (done - 1) // self.per_epoch
            run.log({"event": "eval", "step": done, "epoch": epoch, **self.last})

    def write(self, directory: Path, weights: dict[str, Tensor] | None) -> None:
        self.model.save_pretrained(directory)
        text = json.dumps(self.cfg.to_dict(), indent=2) + "\n"
        (directory / self.config_file).write_text(text)

    def finish(self, run: Run, final: Path) -> HeadFit:
        n_train, n_val = len(self.train_idx), len(self.val_idx)
        return HeadFit(n_train, n_val, self.last["val_loss"], self.init["val_loss"])
