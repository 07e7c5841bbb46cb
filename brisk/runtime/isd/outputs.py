"""What brisk's decode loop keeps per request around the pure ISD step: the output so far, its
stop (EOS or token budget) and the round statistics, as ``[B, …]`` tensors updated once per
round without a host synchronization.

:func:`brisk.runtime.isd.batched.step` commits ``count = L + 1`` tokens per row and knows nothing
of stops; :func:`commit` appends them, cuts a request at its first EOS (kept) or when it reaches
its budget (``max_new_tokens``, or its own smaller one), and counts:

- ``forwards`` and ``committed`` (tokens committed by those forwards, before the cut): TPF;
- ``accept_log``: L of every verify round;
- complete renewal cycles (a full acceptance, or a rejection and the cold start after it):
  ``cycle_tokens``, ``cycle_forwards`` and the histogram of L over them, the quantities of the
  ISD cost model (eq:idlm_tpf_instantiation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.result import RequestOutput
from brisk.runtime.isd.state import StepResult, _Rows

__all__ = ["FINISHED_EOS", "FINISHED_LENGTH", "RUNNING", "Outputs", "RoundStats", "commit"]

RUNNING, FINISHED_EOS, FINISHED_LENGTH = 0, 1, 2


@dataclass(frozen=True)
class RoundStats(_Rows):
    """Per-request counters, as tensors, turned into :class:`RequestOutput` at the end."""

    forwards: Tensor  # [B] forwards: the prefill (it commits the first token) and the rounds
    committed: Tensor  # [B] tokens committed by them (before any cut at EOS / budget)
    rounds: Tensor  # [B] verify rounds
    accept_log: Tensor  # [B, R] L of verify round r (−1 beyond ``rounds``)
    cycle_tokens: Tensor  # [B] over complete renewal cycles (verify round + cold start)
    cycle_forwards: Tensor  # [B]
    cycle_hist: Tensor  # [B, M + 1] counts of L over complete cycles
    open_L: Tensor  # [B] L of a rejection awaiting its cold start (−1: none)


@dataclass(frozen=True)
class Outputs(_Rows):
    """The requests of a batch: tokens output so far, how each finished, statistics."""

    out: Tensor  # [B, max_new + M + 1] committed tokens; the output is out[:, :n_out]
    n_out: Tensor  # [B]
    finished: Tensor  # [B] int8: RUNNING, FINISHED_EOS or FINISHED_LENGTH
    stats: RoundStats
    budget: Tensor  # [B] the request's token budget, ≤ max_new_tokens

    @classmethod
    def empty(
        cls,
        B: int,
        options: ISDOptions,
        device: torch.device | str,
        budget: Tensor | None = None,
    ) -> Outputs:
        """B requests with nothing output yet; ``budget [B]`` defaults to ``max_new_tokens``."""
        M = options.M

        def zeros(*shape: int, fill: int = 0) -> Tensor:
            return torch.full(shape, fill, dtype=torch.long, device=device)

        stats = RoundStats(
            forwards=zeros(B),
            committed=zeros(B),
            rounds=zeros(B),
            accept_log=zeros(B, options.max_new_tokens + 1, fill=-1),
            cycle_tokens=zeros(B),
            cycle_forwards=zeros(B),
            cycle_hist=zeros(B, M + 1),
            open_L=zeros(B, fill=-1),
        )
        if budget is None:
            budget = zeros(B, fill=options.max_new_tokens)
        out = zeros(B, options.max_new_tokens + M + 1)
        return cls(out, zeros(B), zeros(B).to(torch.int8), stats, budget.to(device, torch.long))

    @property
    def done(self) -> Tensor:
        """[B] bool: the request has stopped."""
        return self.finished != RUNNING

    def request_output(self, b: int, M: int) -> RequestOutput:
        """Row b as a :class:`RequestOutput` (once per request, when it finishes)."""
        st = self.stats
        rounds = int(st.rounds[b])
        hist = st.cycle_hist[b].tolist()
        return RequestOutput(
            tokens=self.out[b, : int(self.n_out[b])].tolist(),
            forwards=int(st.forwards[b]),
            committed=int(st.committed[b]),
            accept_lengths=st.accept_log[b, :rounds].tolist(),
            cycle_tokens=int(st.cycle_tokens[b]),
            cycle_forwards=int(st.cycle_forwards[b]),
            cycle_lengths=np.repeat(np.arange(M + 1), hist).tolist(),
            finished="eos" if int(self.finished[b]) == FINISHED_EOS else "length",
        )


def commit(outputs: Outputs, result: StepResult, options: ISDOptions) -> Outputs:
    """``outputs`` after one round of ``result``: its committed tokens appended up to the first
    EOS (kept) or its budget, the request marked finished there, the statistics counted. Every
    row of ``result`` is a running request."""
    M = options.M
    count, chunk, L, ver = result.count, result.tokens, result.accept_len, result.verified
    device = count.device
    j = torch.arange(M + 1, device=device)
    room = outputs.budget - outputs.n_out
    cut = count
    is_eos = torch.zeros_like(ver)
    if options.eos_token_id is not None:
        hits = (chunk == options.eos_token_id) & (j < count[:, None])
        first = hits.long().argmax(1)
        is_eos = hits.any(1) & (first < room)
        cut = torch.where(hits.any(1), torch.minimum(first + 1, count), count)
    take = torch.minimum(cut, room)
    is_length = ~is_eos & (take == room)
    index = outputs.n_out[:, None] + j
    out = outputs.out.scatter(
        1, index, torch.where(j < take[:, None], chunk, outputs.out.gather(1, index))
    )
    finished = torch.where(
        is_eos, FINISHED_EOS, torch.where(is_length, FINISHED_LENGTH, outputs.finished.long())
    ).to(torch.int8)

    # Per-round accept lengths and complete renewal cycles.
    st = outputs.stats
    full, rejected = ver & (L == M), ver & (L >= 0) & (L < M)
    closing = ~ver & (st.open_L >= 0)
    # slot `rounds` of a row's log still holds −1, so non-verifying rows write −1 back
    accept_log = st.accept_log.scatter(1, st.rounds[:, None], torch.where(ver, L, -1)[:, None])
    hist_at = torch.where(full, M, st.open_L.clamp(min=0))
    stats = RoundStats(
        forwards=st.forwards + 1,
        committed=st.committed + count,
        rounds=st.rounds + ver.long(),
        accept_log=accept_log,
        cycle_tokens=st.cycle_tokens
        + torch.where(full, M + 1, 0)
        + torch.where(closing, st.open_L + 2, 0),
        cycle_forwards=st.cycle_forwards + full.long() + 2 * closing.long(),
        cycle_hist=st.cycle_hist.scatter_add(1, hist_at[:, None], (full | closing).long()[:, None]),
        open_L=torch.where(rejected, L, torch.where(closing, -1, st.open_L)),
    )
    return Outputs(out, outputs.n_out + take, finished, stats, outputs.budget)
