"""Packed I-DLM batches: several examples per row up to a token budget, never attending across.

Examples ``e`` (bos, prompt, response, eos; lengths ``ℓ_e``) are laid end to end in rows of
``L`` tokens (next fit, in order: an example that does not fit starts a new row); the rest of a
row is padding. Row r's sequence is ``[x_t | x_0]`` of its examples, where each example's noisy
copy, labels and block layout are exactly those :func:`~brisk.runtime.train.idlm.build_batch`
gives it alone: positions restart at 0 per example (``p``), blocks are
``blk(p) = ⌊(p − o)/M⌋`` within it, slot ``(p − o) mod M``, and position p predicts
``x_0[p + 1]`` of the same example. The document of an index is its example's number
(−1 on padding), and the mask (:mod:`brisk.runtime.train.flex`) is the I-DLM rule table
conjoined with ``d(q) = d(k)``, so an example attends exactly to what it attends to alone and
its logits, hence its losses, are those of the unpacked batch.

Losses are token means over the whole batch, as in ``idlm_loss`` and the proposal loss
(eq:brisk_weighting):

    L = Σ_j w_{slot(j)} ℓ_j / n_noisy + α · Σ_j ℓ_j^clean / n_clean,   α = sg(CE_noisy/CE_clean)
    ("auto", from the unweighted noisy CE) or fixed,

which do not depend on how examples are distributed over rows; w ≡ 1 is the plain I-DLM loss,
and BRISK weights ``w [M]`` (one row shared by every block, as ``position_weights`` gives for
brisk/uniform/decay) enter through :func:`slot_weights`. The per-example breakdown
(``ce_noisy [N]``, ``ce_clean [N]``, ``slot_ce [N, M]``) is what the unpacked batch gives row by
row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask
from transformers import PreTrainedModel

from brisk.runtime.train.flex import bucket, idlm_block_mask, use_flex
from brisk.runtime.train.idlm import IGNORE, may_attend, stream_ce, stream_outputs

__all__ = [
    "PackedBatch",
    "PackedLoss",
    "pack_batch",
    "pack_rows",
    "packed_block_mask",
    "packed_dense_mask",
    "packed_forward",
    "packed_logits",
    "packed_loss",
    "pad_rows",
    "slot_weights",
]


@dataclass(frozen=True)
class PackedBatch:
    """Model inputs and labels of packed rows (``R`` rows of ``L`` tokens, ``N`` examples)."""

    input_ids: Tensor  # [R, 2L]  [x_t | x_0] of the row's examples
    position_ids: Tensor  # [R, 2L] in-example positions, twice
    docs: Tensor  # [R, L] example number of every token, −1 on padding
    noisy_labels: Tensor  # [R, L] x_0[p+1] at MASK slots, IGNORE elsewhere
    clean_labels: Tensor  # [R, L] x_0[p+1] where p+1 is a response token, IGNORE elsewhere
    slot: Tensor  # [R, L] (p − offset) mod M
    M: int
    offset: int
    n_examples: int

    @property
    def L(self) -> int:
        return self.noisy_labels.shape[1]


def pack_rows(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Next-fit packing in order: the example indices of each row, every row ≤ ``budget``.

    >>> pack_rows([3, 4, 2, 5], 7)
    [[0, 1], [2, 3]]
    """
    rows: list[list[int]] = []
    used = budget
    for e, n in enumerate(lengths):
        if not 1 <= n <= budget:
            raise ValueError(f"lengths: example {e} has {n} tokens, budget is {budget}")
        if used + n > budget:
            rows.append([])
            used = 0
        rows[-1].append(e)
        used += n
    return rows


def _example_streams(
    seq: Sequence[int], prompt_len: int, mask_token_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One example's ``(x_t, x_0, noisy_labels, clean_labels)``, each ``[ℓ]`` (module doc)."""
    x0 = torch.as_tensor(list(seq), dtype=torch.long)
    n = len(x0)
    if not 1 <= prompt_len <= n:
        raise ValueError(f"prompt_lens: each must lie in 1..len(sequence), got {prompt_len}")
    pos = torch.arange(n)
    is_response = pos >= prompt_len
    target = torch.cat([x0[1:], x0.new_full((1,), IGNORE)])
    has_target = pos + 1 < n
    clean = torch.where(has_target & (pos + 1 >= prompt_len), target, IGNORE)
    noisy = torch.where(has_target & is_response, target, IGNORE)
    return torch.where(is_response, mask_token_id, x0), x0, noisy, clean


def pack_batch(
    seqs: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    M: int,
    mask_token_id: int,
    pad_token_id: int,
    budget: int,
    offset: int = 0,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Pack ``seqs`` (full token ids, prompt first) into rows of ``budget`` tokens."""
    if M < 1:
        raise ValueError(f"M: block size must be ≥ 1, got {M}")
    if len(seqs) != len(prompt_lens) or not seqs:
        raise ValueError("prompt_lens: need one prompt length per sequence (and ≥ 1 sequence)")
    rows = pack_rows([len(s) for s in seqs], budget)
    R, L = len(rows), budget
    x_t = torch.full((R, L), pad_token_id, dtype=torch.long)
    x_0, positions = x_t.clone(), torch.zeros(R, L, dtype=torch.long)
    docs = torch.full((R, L), -1, dtype=torch.long)
    noisy, clean = torch.full((R, L), IGNORE), torch.full((R, L), IGNORE)
    for r, members in enumerate(rows):
        start = 0
        for e in members:
            t, x, nl, cl = _example_streams(seqs[e], prompt_lens[e], mask_token_id)
            span = slice(start, start + len(x))
            x_t[r, span], x_0[r, span], noisy[r, span], clean[r, span] = t, x, nl, cl
            positions[r, span], docs[r, span] = torch.arange(len(x)), e
            start += len(x)
        positions[r, start:] = torch.arange(L - start)  # padding: a document of its own
    dev = torch.device(device)
    return PackedBatch(
        input_ids=torch.cat([x_t, x_0], 1).to(dev),
        position_ids=torch.cat([positions, positions], 1).to(dev),
        docs=docs.to(dev),
        noisy_labels=noisy.to(dev),
        clean_labels=clean.to(dev),
        slot=(positions - offset).remainder(M).to(dev),
        M=M,
        offset=offset,
        n_examples=len(seqs),
    )


def packed_block_mask(batch: PackedBatch) -> BlockMask:
    """The ``BlockMask`` of the batch: I-DLM rules on in-example positions, same document."""
    docs = torch.cat([batch.docs, batch.docs], 1)
    return idlm_block_mask(
        batch.L,
        batch.M,
        batch.offset,
        positions=batch.position_ids,
        docs=docs,
        device=batch.input_ids.device,
    )


def packed_dense_mask(batch: PackedBatch) -> Tensor:
    """The same mask as a dense boolean ``[R, 2L, 2L]``: the reference for small ``L``."""
    L = batch.L
    noisy = torch.arange(2 * L, device=batch.docs.device) < L
    pos = batch.position_ids
    docs = torch.cat([batch.docs, batch.docs], 1)
    rules = may_attend(
        noisy[None, :, None],
        pos[:, :, None],
        noisy[None, None],
        pos[:, None],
        batch.M,
        batch.offset,
    )
    return rules & (docs[:, :, None] == docs[:, None])


def pad_rows(batch: PackedBatch, rows: int) -> PackedBatch:
    """``batch`` with padding rows appended up to ``rows``: token 0, positions ``0..L−1`` in
    both streams, document −1, no labels. A padding row attends only within itself, so the
    real rows' logits are unchanged (compiled flex pads the row count to a rung of
    :func:`~brisk.runtime.train.flex.bucket` with these, module docstring of
    :mod:`~brisk.runtime.train.flex`)."""
    R, L = batch.docs.shape
    if rows < R:
        raise ValueError(f"rows: {rows} is fewer than the batch's {R}")
    if rows == R:
        return batch
    n, dev = rows - R, batch.docs.device
    pos = torch.arange(L, device=dev).repeat(n, 2)
    full = batch.docs.new_full((n, L), -1)
    none = batch.noisy_labels.new_full((n, L), IGNORE)
    return replace(
        batch,
        input_ids=torch.cat([batch.input_ids, batch.input_ids.new_zeros(n, 2 * L)]),
        position_ids=torch.cat([batch.position_ids, pos]),
        docs=torch.cat([batch.docs, full]),
        noisy_labels=torch.cat([batch.noisy_labels, none]),
        clean_labels=torch.cat([batch.clean_labels, none]),
        slot=torch.cat([batch.slot, (pos[:, :L] - batch.offset).remainder(batch.M)]),
    )


def packed_logits(
    net: Any, batch: PackedBatch, pad: bool = False, hidden: bool = False
) -> tuple[Tensor, Tensor]:
    """Noisy and clean logits ``[R, L, V]`` (``hidden``: last hidden states ``[R, L, H]``) of
    ``net`` (its attention already flex) on the packed rows; ``pad`` runs them with the row
    count padded to a rung of :func:`~brisk.runtime.train.flex.bucket` (:func:`pad_rows`)."""
    R, L = batch.docs.shape
    run = pad_rows(batch, bucket(R)) if pad else batch
    mask = packed_block_mask(run)
    return stream_outputs(
        net,
        L,
        hidden=hidden,
        rows=R,
        input_ids=run.input_ids,
        position_ids=run.position_ids,
        attention_mask=mask,
    )


def packed_forward(
    model: PreTrainedModel, batch: PackedBatch, *, compile: bool = False
) -> tuple[Tensor, Tensor]:
    """Noisy and clean logits of the packed rows, each ``[R, L, V]``, through flex attention
    (compiled: the row count padded as :func:`packed_logits` does)."""
    with use_flex(model, compile):
        return packed_logits(model, batch, pad=compile)


def slot_weights(batch: PackedBatch, weights: Tensor) -> Tensor:
    """Token weights ``[R, L]``: ``weights[slot(j)]`` at labelled MASK slots, 0 elsewhere;
    ``weights [M]`` or ``[1, M]`` (shared by every block)."""
    w = weights.reshape(-1).to(batch.slot.device)
    if w.numel() != batch.M:
        raise ValueError(f"weights: expected M = {batch.M} values, got {w.numel()}")
    return torch.where(batch.noisy_labels != IGNORE, w[batch.slot], 0.0)


@dataclass(frozen=True)
class PackedLoss:
    loss: Tensor  # scalar, Σ w ℓ / n_noisy + α · CE_clean
    ce_noisy: Tensor  # scalar, unweighted
    ce_clean: Tensor  # scalar
    alpha: float
    example_ce_noisy: Tensor  # [N] mean CE of the example's MASK slots (0 where none)
    example_ce_clean: Tensor  # [N]
    slot_ce: Tensor  # [N, M] mean CE at proposal position i of each example (0 where none)
    slot_count: Tensor  # [N, M]


def _per_example(values: Tensor, index: Tensor, N: int) -> Tensor:
    """Sums of ``values`` grouped by ``index`` (``−1`` dropped): ``[N]`` or ``[N, M]``."""
    keep = index >= 0
    return torch.zeros(N, device=values.device).index_add_(0, index[keep], values[keep])


def packed_loss(
    noisy_logits: Tensor,
    clean_logits: Tensor,
    batch: PackedBatch,
    alpha: float | Literal["auto"] = "auto",
    token_weights: Tensor | None = None,
) -> PackedLoss:
    """The batch loss and its per-example breakdown (module docstring)."""
    noisy_ok, clean_ok = batch.noisy_labels != IGNORE, batch.clean_labels != IGNORE
    ce_n, ce_c = stream_ce(noisy_logits, clean_logits, batch)
    n_noisy, n_clean = noisy_ok.sum().clamp(min=1), clean_ok.sum().clamp(min=1)
    ce_noisy, ce_clean = ce_n.sum() / n_noisy, ce_c.sum() / n_clean
    a = float((ce_noisy / ce_clean.clamp(min=1e-8)).detach()) if alpha == "auto" else float(alpha)
    w = noisy_ok.float() if token_weights is None else token_weights
    loss = (w * ce_n).sum() / n_noisy + a * ce_clean

    N, M = batch.n_examples, batch.M
    ex_n, ex_c = batch.docs.where(noisy_ok, -1), batch.docs.where(clean_ok, -1)
    cell = (ex_n * M + batch.slot).where(noisy_ok, -1)  # (example, slot) as one index
    d_ce_n = ce_n.detach()
    slot_sum = _per_example(d_ce_n, cell, N * M).view(N, M)
    slot_count = _per_example(noisy_ok.float(), cell, N * M).view(N, M)
    count_n = _per_example(noisy_ok.float(), ex_n, N).clamp(min=1)
    count_c = _per_example(clean_ok.float(), ex_c, N).clamp(min=1)
    return PackedLoss(
        loss=loss,
        ce_noisy=ce_noisy,
        ce_clean=ce_clean,
        alpha=a,
        example_ce_noisy=_per_example(d_ce_n, ex_n, N) / count_n,
        example_ce_clean=_per_example(ce_c.detach(), ex_c, N) / count_c,
        slot_ce=slot_sum / slot_count.clamp(min=1),
        slot_count=slot_count,
    )
