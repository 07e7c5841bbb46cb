"""Block logging from ISD: one mechanism-schema row per verify round (DESIGN.md, mechanism).

Each row records the state the replay diagnostics need: the Top-K candidates C_i of the base
proposal and q over them, the verifier p over them under the block's own prefix (NaN after the
first breaker, whose prefix was never factual), the verifier's top-1, the acceptance draws u_i,
the base's and the head's choices (the head in shadow mode when decoding head-off) and L.
In greedy decoding u_i is still drawn, for the replay's same-state rule only. With
``ISDOptions.score_blocks`` the whole-block log-likelihoods of the base and head blocks from
the round's prefix (eq. 9) fill ``base_logp`` / ``head_logp`` (diagnostics: an extra forward).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from brisk.mechanism.io import BlockLogWriter
from brisk.runtime.verify import VerifyResult

if TYPE_CHECKING:
    from brisk.runtime.isd import Draft

__all__ = ["BlockLogger"]


class BlockLogger(BlockLogWriter):
    """A :class:`brisk.mechanism.io.BlockLogWriter` at ``path`` that takes ISD verify rounds."""

    def __init__(self, path: str | Path, M: int, K: int, rows_per_group: int = 4096) -> None:
        super().__init__(path, M, K, rows_per_group=rows_per_group)
        self.M, self.K = M, K

    def log(
        self,
        batch: Any,
        rows: Tensor,
        drafts: list[tuple[Draft, int, int] | None],
        p: Tensor,
        result: VerifyResult,
        u: Tensor | None,
        base_logp: Tensor | None = None,
        head_logp: Tensor | None = None,
    ) -> None:
        """Write the verify round of ``rows`` (p: ``[n, M+1, V]`` at the decoding temperature)."""
        M = self.M
        entries = [d for d in drafts if d is not None]
        cand = torch.stack([d.cand_ids[i] for d, i, _ in entries])  # [n, M, K]
        if cand.shape[-1] != self.K:
            raise ValueError(
                f"K: the log holds {self.K} candidates, the draft has {cand.shape[-1]}"
            )
        L = result.accept_len
        reached = torch.arange(M, device=L.device)[None] <= L[:, None]  # i ≤ min(L + 1, M)
        p_blk = p[:, :M]
        p_cand = p_blk.gather(-1, cand).masked_fill(~reached[..., None], float("nan"))
        top_prob, top1 = p_blk.max(-1)
        columns = {
            "request_id": np.array([batch.request_ids[b] for b in rows.tolist()], dtype=np.int64),
            "block_index": np.array([batch.block_index[b] for b in rows.tolist()], dtype=np.int64),
            "anchor": np.array([a for _, _, a in entries], dtype=np.int32),
            "cand_ids": cand.cpu().numpy(),
            "q": torch.stack([d.q[i] for d, i, _ in entries]).float().cpu().numpy(),
            "p": p_cand.float().cpu().numpy(),
            "verifier_top1": torch.where(reached, top1, -1).cpu().numpy(),
            "verifier_top1_prob": torch.where(reached, top_prob, float("nan")).cpu().numpy(),
            "u": (u[:, :M] if u is not None else torch.full((len(rows), M), float("nan")))
            .double()
            .cpu()
            .numpy(),
            "base_choice": torch.stack([d.base_choice[i] for d, i, _ in entries]).cpu().numpy(),
            "head_choice": torch.stack([d.head_choice[i] for d, i, _ in entries]).cpu().numpy(),
            "accept_len": L.cpu().numpy(),
        }
        for name, value in (("base_logp", base_logp), ("head_logp", head_logp)):
            if value is not None:  # NaN is stored as null: not scored
                columns[name] = value.double().cpu().numpy()
        self.write(columns)
