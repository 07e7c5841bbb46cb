"""The I-DLM training objective: one forward over the duplicated sequence ``[x_t | x_0]``.

For a batch of sequences ``x_0 [B, L]`` (bos, prompt, response, eos; right-padded) the noisy copy
``x_t`` equals ``x_0`` with every response token replaced by MASK; both copies share position ids
``0..L−1``. With block size ``M = N − 1`` and blocks by position, ``blk(j) = ⌊(j − o)/M⌋`` (offset
``o``, 0 in I-DLM; shifting it moves which positions act as block starts), a query may attend to

    noisy j → noisy k   iff blk(k) = blk(j) and k ≤ j      (same block, causal)
    noisy j → clean k   iff blk(k) < blk(j)                (strictly earlier blocks)
    clean j → clean k   iff k ≤ j                          (plain causal)

and nothing else (clean never sees noisy). Labels are shifted by one: position j predicts
``x_0[j + 1]``. The clean stream is an ordinary causal LM; a MASK at slot i of a block (i = 1..M)
sees the clean prefix before the block and predicts the token i + 1 places after it, exactly as
ISD's MASK slots do at inference. The loss is

    L = CE_noisy + α · CE_clean,   α fixed (I-DLM: 0.2) or auto-balanced α = sg(CE_noisy/CE_clean)

with CE_noisy averaged over MASK slots with a label and CE_clean over response targets. The
per-proposal-position cross-entropy ``slot_ce [B, M]`` (mean over the blocks of a row) is what the
BRISK proposal loss reweights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

from brisk.runtime.train.distributed import Dist

__all__ = [
    "IGNORE",
    "IDLMBatch",
    "IDLMLoss",
    "auto_alpha",
    "block_diffusion_mask",
    "block_ids",
    "build_batch",
    "idlm_forward",
    "idlm_loss",
    "label_counts",
    "loss_totals",
    "may_attend",
    "response_blocks",
    "stream_ce",
    "stream_outputs",
    "token_ce",
    "weighted_loss",
]

IGNORE = -100


def block_ids(L: int, M: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
    """``blk(j) = ⌊(j − offset)/M⌋`` for ``j = 0..L−1``: ``[L]`` int64 (−1 before the offset)."""
    pos = torch.arange(L, device=device)
    return torch.div(pos - offset, M, rounding_mode="floor")


def may_attend(
    q_noisy: Tensor,
    q_pos: Tensor,
    k_noisy: Tensor,
    k_pos: Tensor,
    M: int | Tensor,
    offset: int | Tensor = 0,
) -> Tensor:
    """The rule table of the module docstring as a predicate on broadcastable index tensors
    (stream flags and positions of query and key): the one definition of the I-DLM mask, shared
    by the dense ``[2L, 2L]`` mask below and the FlexAttention ``mask_mod`` of
    :mod:`brisk.runtime.train.flex` (where the arguments are 0-d tensors)."""
    q_blk, k_blk = (q_pos - offset) // M, (k_pos - offset) // M
    causal = k_pos <= q_pos
    noisy_noisy = q_noisy & k_noisy & (k_blk == q_blk) & causal
    noisy_clean = q_noisy & ~k_noisy & (k_blk < q_blk)
    clean_clean = ~q_noisy & ~k_noisy & causal
    return noisy_noisy | noisy_clean | clean_clean


def block_diffusion_mask(
    L: int, M: int, offset: int = 0, device: torch.device | None = None
) -> Tensor:
    """Boolean ``[2L, 2L]`` (True = may attend); rows ``0..L−1`` noisy, ``L..2L−1`` clean."""
    idx = torch.arange(2 * L, device=device)
    noisy, pos = idx < L, idx % L
    return may_attend(noisy[:, None], pos[:, None], noisy[None], pos[None], M, offset)


@dataclass(frozen=True)
class IDLMBatch:
    """Model inputs and labels for one I-DLM step (``L`` = padded length, ``M`` = block size)."""

    input_ids: Tensor  # [B, 2L]  [x_t | x_0]
    position_ids: Tensor  # [B, 2L]  0..L−1 twice
    attention_mask: Tensor | None  # [1, 1, 2L, 2L] additive (0 or dtype min); None: flex builds it
    noisy_labels: Tensor  # [B, L] x_0[j+1] at MASK slots, IGNORE elsewhere
    clean_labels: Tensor  # [B, L] x_0[j+1] where j+1 is a response token, IGNORE elsewhere
    slot: Tensor  # [L] slot index (j − offset) mod M, 0-based
    block_start: Tensor  # [L] first position of j's block
    prompt_lens: Tensor  # [B]
    M: int

    @property
    def L(self) -> int:
        return self.noisy_labels.shape[1]


def build_batch(
    seqs: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    M: int,
    mask_token_id: int,
    pad_token_id: int,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    dense_mask: bool = True,
) -> IDLMBatch:
    """Pad ``seqs`` (full token ids, prompt first) and build ``[x_t | x_0]`` with its mask
    (``dense_mask=False``: no ``[2L, 2L]`` mask; the flex path builds its ``BlockMask``)."""
    if M < 1:
        raise ValueError(f"M: block size must be ≥ 1, got {M}")
    if len(seqs) != len(prompt_lens) or not seqs:
        raise ValueError("prompt_lens: need one prompt length per sequence (and ≥ 1 sequence)")
    B, L = len(seqs), max(len(s) for s in seqs)
    x0 = torch.full((B, L), pad_token_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        x0[b, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    lengths = torch.as_tensor([len(s) for s in seqs])
    P = torch.as_tensor(list(prompt_lens))
    if bool(((P < 1) | (lengths < P)).any()):
        raise ValueError("prompt_lens: each must lie in 1..len(sequence)")
    pos = torch.arange(L)
    is_response = (pos[None] >= P[:, None]) & (pos[None] < lengths[:, None])  # [B, L]
    x_t = torch.where(is_response, mask_token_id, x0)

    target = torch.cat([x0[:, 1:], torch.full((B, 1), IGNORE)], dim=1)  # x_0[j+1]
    has_target = pos[None] + 1 < lengths[:, None]
    clean_labels = torch.where(has_target & (pos[None] + 1 >= P[:, None]), target, IGNORE)
    noisy_labels = torch.where(has_target & is_response, target, IGNORE)

    additive = None
    if dense_mask:
        allowed = block_diffusion_mask(L, M, offset)
        additive = torch.zeros(2 * L, 2 * L, dtype=dtype).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )[None, None]
    blk = block_ids(L, M, offset)
    dev = torch.device(device)
    return IDLMBatch(
        input_ids=torch.cat([x_t, x0], dim=1).to(dev),
        position_ids=torch.cat([pos, pos]).expand(B, 2 * L).to(dev),
        attention_mask=additive.to(dev) if additive is not None else None,
        noisy_labels=noisy_labels.to(dev),
        clean_labels=clean_labels.to(dev),
        slot=(pos - offset).remainder(M).to(dev),
        block_start=(blk * M + offset).to(dev),
        prompt_lens=P.to(dev),
        M=M,
    )


def idlm_forward(
    model: PreTrainedModel, batch: IDLMBatch, *, hidden: bool = False
) -> tuple[Tensor, Tensor]:
    """Logits of the noisy and the clean stream, each ``[B, L, V]`` (``hidden``: their last
    hidden states ``[B, L, H]``, :func:`stream_outputs`)."""
    if batch.attention_mask is None:
        raise ValueError(
            "batch: built without its dense mask (dense_mask=False): use the flex "
            "forward (brisk.runtime.train.forward.training_forward)"
        )
    return stream_outputs(
        model,
        batch.L,
        hidden=hidden,
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
    )


def stream_outputs(
    net: Any,
    L: int,
    *,
    hidden: bool = False,
    padded: int | None = None,
    rows: int | None = None,
    **inputs: Any,
) -> tuple[Tensor, Tensor]:
    """``net`` (a causal LM, or its DDP / FSDP wrapper) on ``[x_t | x_0]`` whose streams are
    ``padded`` (default L) long: the noisy and the clean stream's logits ``[B, L, V]`` at the L
    real positions of each (rows ``:rows``), or with ``hidden`` their last hidden states
    ``[B, L, H]`` (after the final norm: the LM head's input), the vocabulary projection then
    run for one position only — the training losses apply the head in chunks
    (:mod:`brisk.runtime.train.vocab`). The call goes through ``net`` itself, so FSDP's hooks
    gather the root's parameters (embeddings, norm, LM head) as for any forward."""
    Lp = L if padded is None else padded
    extra: dict[str, Any] = {"output_hidden_states": True, "logits_to_keep": 1} if hidden else {}
    if not hidden and Lp > L:
        real = torch.arange(L, device=inputs["input_ids"].device)
        extra["logits_to_keep"] = torch.cat([real, Lp + real])
    out = net(**inputs, use_cache=False, **extra)
    if hidden:
        last = out.hidden_states[-1]
        return last[:rows, :L], last[:rows, Lp : Lp + L]
    return out.logits[:rows, :L], out.logits[:rows, L:]


@dataclass(frozen=True)
class IDLMLoss:
    loss: Tensor  # scalar, CE_noisy + α·CE_clean
    ce_noisy: Tensor  # scalar
    ce_clean: Tensor  # scalar
    alpha: float
    slot_ce: Tensor  # [B, M] mean CE of the MASK slots at proposal position i (0 where none)
    slot_count: Tensor  # [B, M] how many MASK slots of the row contributed


def token_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-token cross-entropy ``[B, L]`` of ``logits [B, L, V]`` against ``labels [B, L]``, in
    float32, 0 where the label is :data:`IGNORE`."""
    return F.cross_entropy(
        logits.float().transpose(1, 2), labels, ignore_index=IGNORE, reduction="none"
    )


def idlm_loss(
    noisy_logits: Tensor,
    clean_logits: Tensor,
    batch: IDLMBatch,
    alpha: float | Literal["auto"] = "auto",
) -> IDLMLoss:
    """The I-DLM loss and its per-proposal-position breakdown (see the module docstring)."""
    noisy_ok, clean_ok = batch.noisy_labels != IGNORE, batch.clean_labels != IGNORE
    ce_noisy_tok, ce_clean_tok = stream_ce(noisy_logits, clean_logits, batch)
    ce_noisy = ce_noisy_tok.sum() / noisy_ok.sum().clamp(min=1)
    ce_clean = ce_clean_tok.sum() / clean_ok.sum().clamp(min=1)
    # auto: α = sg(CE_noisy / CE_clean) puts both streams on the same scale at every step.
    a = float((ce_noisy / ce_clean.clamp(min=1e-8)).detach()) if alpha == "auto" else float(alpha)
    B, M = noisy_logits.shape[0], batch.M
    slot = batch.slot.expand(B, -1)
    sums = torch.zeros(B, M, device=ce_noisy_tok.device).scatter_add_(1, slot, ce_noisy_tok)
    count = torch.zeros(B, M, device=ce_noisy_tok.device).scatter_add_(1, slot, noisy_ok.float())
    return IDLMLoss(
        loss=ce_noisy + a * ce_clean,
        ce_noisy=ce_noisy,
        ce_clean=ce_clean,
        alpha=a,
        slot_ce=sums / count.clamp(min=1),
        slot_count=count,
    )


def label_counts(batch: Any) -> Tensor:
    """``[n_noisy, n_clean]`` (float64, CPU): the labels a batch (an :class:`IDLMBatch` or a
    packed one) adds to a step's loss denominators, known before any forward."""
    n = [(batch.noisy_labels != IGNORE).sum(), (batch.clean_labels != IGNORE).sum()]
    return torch.stack(n).double().cpu()


def auto_alpha(ce_noisy: float, ce_clean: float) -> float:
    """α auto = sg(CE_noisy / CE_clean): both streams on the same scale."""
    return ce_noisy / max(ce_clean, 1e-8)


def loss_totals(noisy_logits: Tensor, clean_logits: Tensor, batch: IDLMBatch) -> Tensor:
    """This batch's ``[Σ ℓ_noisy, Σ ℓ_clean, n_noisy, n_clean]`` (float64, no gradient): the
    unweighted cross-entropy sums and label counts the loss's denominators and ``α`` come from,
    summed over micro-batches and ranks before any gradient is taken."""
    with torch.no_grad():
        ce_noisy, ce_clean = stream_ce(noisy_logits, clean_logits, batch)
        n_noisy = (batch.noisy_labels != IGNORE).sum().float()
        n_clean = (batch.clean_labels != IGNORE).sum().float()
        return torch.stack([ce_noisy.sum(), ce_clean.sum(), n_noisy, n_clean]).double().cpu()


def stream_ce(noisy_logits: Tensor, clean_logits: Tensor, batch: Any) -> tuple[Tensor, Tensor]:
    """Per-token cross-entropies ``[B, L]`` of both streams of a batch (its ``noisy_labels``
    and ``clean_labels``: an :class:`IDLMBatch` or a packed one), in fp32, 0 where
    unlabelled."""
    return token_ce(noisy_logits, batch.noisy_labels), token_ce(clean_logits, batch.clean_labels)


def weighted_loss(
    noisy_logits: Tensor,
    clean_logits: Tensor,
    batch: IDLMBatch,
    token_weights: Tensor,
    alpha: float | str = "auto",
    dist: Dist | None = None,
    totals: Tensor | None = None,
) -> dict[str, Any]:
    """The weighted I-DLM loss of :mod:`brisk.runtime.train.proposal.recipe` (eq:brisk_weighting),
    ``Σ w ℓ / n_noisy + α · CE_clean``. ``token_weights [B, L]`` multiply the MASK
    slots' cross-entropies. The denominators and ``α`` are the step's global figures:
    ``totals`` (:func:`loss_totals` summed over the step's micro-batches and ranks) when this
    batch is one micro-batch of a step, else this batch's own, all-reduced under ``dist``.
    Returns ``loss``, this batch's share to backpropagate (scaled by the world size, as DDP and
    FSDP average gradients; the shares of a step's micro-batches sum to the step's loss),
    ``weighted`` (its detached Σ w ℓ), ``alpha`` and ``totals``."""
    dist = dist or Dist()
    ce_noisy, ce_clean = stream_ce(noisy_logits, clean_logits, batch)
    weighted = (token_weights * ce_noisy).sum()
    clean = ce_clean.sum()
    if totals is None:
        totals = dist.sum(loss_totals(noisy_logits, clean_logits, batch))
    plain_g, clean_g, n_noisy, n_clean = totals.tolist()
    n_noisy, n_clean = max(n_noisy, 1.0), max(n_clean, 1.0)
    a = plain_g / n_noisy / max(clean_g / n_clean, 1e-8) if alpha == "auto" else float(alpha)
    loss = dist.world * (weighted / n_noisy + a * clean / n_clean)
    return {"loss": loss, "weighted": weighted.detach(), "alpha": a, "totals": totals}


def response_blocks(
    backbone: Any, pad_id: int, encoded: Sequence[tuple[list[int], int]], M: int, batch_size: int
) -> Iterator[tuple[IDLMBatch, Tensor, Tensor, Tensor]]:
    """Every sequence of ``encoded`` (token ids, prompt length), ``batch_size`` at a time, laid
    out in blocks of ``M`` at each offset 0..M − 1 and forwarded through ``backbone.model``: the
    batch, its noisy and clean logits, and the mask ``[B, L]`` of the MASK slots with a label
    whose block lies inside the response (what an evaluation of the proposals scores)."""
    model = backbone.model
    dtype = next(model.parameters()).dtype
    for start in range(0, len(encoded), batch_size):
        part = encoded[start : start + batch_size]
        seqs, prompt_lens = [s for s, _ in part], [n for _, n in part]
        for offset in range(M):
            batch = build_batch(
                seqs,
                prompt_lens,
                M,
                backbone.mask_token_id,
                pad_id,
                offset=offset,
                dtype=dtype,
                device=backbone.device,
            )
            noisy, clean = idlm_forward(model, batch)
            inside = batch.block_start[None] >= batch.prompt_lens[:, None]  # block ⊂ response
            yield batch, noisy, clean, (batch.noisy_labels != IGNORE) & inside
