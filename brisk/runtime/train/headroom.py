"""Where proposal training has room to act: the MASK stream against the causal stream on a model's
own samples (issue 23's headroom measurement).

For a checkpoint and samples ``x`` (prompt + response; typically the model's own correct ISD
outputs), every response position ``t`` acts as an anchor (block offsets ``0..M−1``, only blocks
inside the response, as :func:`~brisk.runtime.train.evaluate.proposal_accuracy`): proposal
position ``i = 1..M`` at sequence position ``j = t + i`` predicts ``x[j + 1]``

- from the MASK stream, ``q_i = q(· | x[..t], MASK^i)``, and
- from the causal stream, ``p_j = p(· | x[..j])``, the verifier law of the same token.

Per position, over all anchors of all samples,

    CE_mask(i)   = mean −log q_i(x[j + 1])
    CE_causal(i) = mean −log p_j(x[j + 1])
    β_i          = mean Σ_v min(p_j(v), q_i^K(v))   (the ISD acceptance of position i at T = 1
                                                     given the sample's prefix; q^K: Top-K)

CE_mask(i) − CE_causal(i) is the extra surprise of drafting ``i`` tokens ahead without seeing the
``i − 1`` tokens in between: part is inherent (the causal stream's own uncertainty about them),
part is what training can remove. The inherent part is bounded by comparing with a ``reference``
checkpoint whose MASK stream was trained to convergence on the same world (the from-scratch
paper base): its CE_mask on the same samples is achievable by this architecture, so
CE_mask − CE_mask(reference) is headroom that training can close. From β the ISD cost model
(eq:idlm_tpf_instantiation) gives the complete-cycle TPF the teacher-forced profile predicts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.train.evaluate import encode_example
from brisk.runtime.train.idlm import response_blocks
from brisk.theory import CostModel, tpf

__all__ = ["Headroom", "measure_headroom", "read_samples"]


@dataclass(frozen=True)
class Headroom:
    """Per-position figures ``[M]`` of one checkpoint on one set of samples (module docstring)."""

    stride: int
    n_samples: int
    ce_mask: list[float]
    ce_causal: list[float]
    beta: list[float]
    count: list[int]  # anchors (tokens) behind each position's means

    @property
    def gap(self) -> list[float]:
        """CE_mask(i) − CE_causal(i)."""
        return [m - c for m, c in zip(self.ce_mask, self.ce_causal, strict=True)]

    @property
    def predicted_tpf(self) -> float:
        """Complete-cycle ISD TPF at the teacher-forced acceptance β (eq:idlm_tpf_instantiation)."""
        M = self.stride - 1
        return float(tpf(self.beta, CostModel.isd(M)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stride": self.stride,
            "n_samples": self.n_samples,
            "ce_mask": self.ce_mask,
            "ce_causal": self.ce_causal,
            "gap": self.gap,
            "beta": self.beta,
            "count": self.count,
            "predicted_tpf": self.predicted_tpf,
        }


def read_samples(path: str | Path, correct_only: bool = True) -> list[tuple[str, str]]:
    """(prompt, completion) pairs from ``brisk decode --out`` JSON Lines; with ``correct_only``
    only the rows graded correct."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if correct_only:
        if rows and "correct" not in rows[0]:
            raise ValueError(f"samples: {path} has no 'correct' field (decode with answers)")
        rows = [r for r in rows if r.get("correct")]
    if not rows:
        raise ValueError(f"samples: {path} holds no {'correct ' if correct_only else ''}rows")
    return [(str(r["prompt"]), str(r["completion"])) for r in rows]


@torch.no_grad()
def measure_headroom(
    backbone: HFBackbone,
    tokenizer: Any,
    samples: Sequence[tuple[str, str]],
    stride: int = 8,
    temperature: float = 1.0,
    top_k: int = 16,
    batch_size: int = 100,
) -> Headroom:
    """Per-position CE of both streams and the acceptance β on ``samples`` (module docstring)."""
    if stride < 2:
        raise ValueError(f"stride: need N ≥ 2, got {stride}")
    M = stride - 1
    sums = torch.zeros(3, M, dtype=torch.float64)  # CE_mask, CE_causal, β
    count = torch.zeros(M, dtype=torch.float64)
    encoded = [encode_example(p, r, tokenizer) for p, r in samples]
    pad_id = tokenizer.pad_token_id
    for batch, noisy, clean, ok in response_blocks(backbone, pad_id, encoded, M, batch_size):
        target = batch.noisy_labels[ok]
        q_logits, p_logits = noisy.double()[ok], clean.double()[ok]  # [n, V]
        ce_q = F.cross_entropy(q_logits, target, reduction="none")
        ce_p = F.cross_entropy(p_logits, target, reduction="none")
        kth = q_logits.topk(min(top_k, q_logits.shape[-1]), -1).values[..., -1:]
        q = torch.softmax(q_logits.masked_fill(q_logits < kth, -torch.inf) / temperature, -1)
        p = torch.softmax(p_logits / temperature, -1)
        beta = torch.minimum(p, q).sum(-1).clamp(0, 1)
        slot = batch.slot.expand_as(batch.noisy_labels)[ok].cpu()
        for row, values in enumerate((ce_q, ce_p, beta)):
            sums[row].index_add_(0, slot, values.cpu())
        count.index_add_(0, slot, torch.ones(len(slot), dtype=torch.float64))
    means = sums / count.clamp(min=1)
    return Headroom(
        stride,
        len(samples),
        means[0].tolist(),
        means[1].tolist(),
        means[2].tolist(),
        count.long().tolist(),
    )
