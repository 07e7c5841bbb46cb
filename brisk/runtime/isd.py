"""Introspective strided decoding (I-DLM's ISD) with optional corrector, exact end to end.

Stride N, M = N − 1 proposal positions. Every forward feeds 2N − 1 = 2M + 1 slots with causal
attention; the logit at slot t predicts the token after slot t.

- cold start ``[t0, MASK×M]``: slot 0 gives the next token n (sampled from p, committed), the
  MASK slots give the M proposals for the positions after n;
- verify round ``[pending, x_1..x_M, MASK×M]``: slots 0..M−1 give p_1..p_M for the drafts, slot
  M the bonus row p_{M+1}; :func:`brisk.runtime.verify.verify_chain` accepts a prefix L with the
  law π the drafts were *actually* drawn from, so outputs are distributed exactly as
  autoregressive sampling from p (greedy: token-for-token greedy decoding).
  L = M: commit x_1..x_M + bonus, keep their KV and draft the next block from the MASK slots
  (1 forward, M + 1 tokens). L < M: commit x_1..x_L + the correction, drop the rest; the next
  forward is a cold start from the correction (2 forwards, L + 2 tokens with it).
  These are the ISD gains and costs of :meth:`brisk.theory.CostModel.isd`.

Drafts are the argmax of q (greedy), a draw from q restricted to its Top-K candidates C_i
(temperature T; π is that restricted law), or the corrector's choice over C_i, fed back left to
right, with π its softmax over C_i. Base and head thus always choose among the same candidates,
which is also what the block logs record.

Requests of a batch share one physical KV cache but nothing else: each keeps its own slots,
positions and ``torch.Generator``, so its output does not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from brisk.runtime.backbone import Backbone
from brisk.runtime.blocklog import BlockLogger
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd_state import DecodeResult, KVSlots, RequestOutput
from brisk.runtime.verify import ProposalLaw, sample_inverse_cdf, verify_chain

__all__ = ["Draft", "ISDOptions", "decode"]


@dataclass(frozen=True)
class ISDOptions:
    """How to decode. ``temperature`` 0 is greedy."""

    stride: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 256
    eos_token_id: int | None = None
    shadow: bool = False  # run the corrector beside the base for the logs, but decode head-off
    top_k: int = 16  # K: candidates per position when no corrector sets it (drafts and logs)
    # Diagnostics only: score the base and head blocks of every verify round under the verifier
    # for the logs' base_logp / head_logp (eq. 9). Costs one extra forward per round, which is
    # not counted in the statistics.
    score_blocks: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.stride, int) or self.stride < 2:
            raise ValueError(f"stride: need an integer N ≥ 2, got {self.stride!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be ≥ 0, got {self.temperature!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be ≥ 1, got {self.max_new_tokens!r}")

    @property
    def M(self) -> int:
        return self.stride - 1


@dataclass(frozen=True)
class Draft:
    """Proposals for a set of rows and what verification and the logs need about them."""

    tokens: Tensor  # [n, M]
    law: ProposalLaw  # π (point mass when greedy)
    cand_ids: Tensor  # [n, M, K] Top-K of q, by q descending
    q: Tensor  # [n, M, K] q over the candidates (full-vocab normalized)
    base_choice: Tensor  # [n, M] rank of the base's choice in C_i (its drafts are candidates)
    head_choice: Tensor  # [n, M] rank of the head's choice (−1: head not run)
    head_drafted: bool = False  # the head chose ``tokens`` (else the base did)
    alt_tokens: Tensor | None = None  # [n, M] the other selector's whole block, for ΔL


def decode(
    backbone: Backbone,
    prompts: Sequence[Sequence[int]],
    options: ISDOptions | None = None,
    *,
    corrector: Corrector | None = None,
    seeds: Sequence[int] | None = None,
    request_ids: Sequence[int] | None = None,
    logger: BlockLogger | None = None,
    batch_size: int = 64,
    on_finish: Callable[[int, RequestOutput], None] | None = None,
) -> DecodeResult:
    """Decode ``prompts`` (token ids) with ISD; returns tokens and per-request statistics.

    ``seeds[r]`` seeds request r's generator (default: r), so a request's output depends only
    on its prompt and seed. ``logger`` receives one block-log row per verify round.
    ``on_finish(r, output)`` is called as soon as request r (index into ``prompts``) finishes.
    """
    options = options or ISDOptions()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: need at least one prompt, each with at least one token")
    if corrector is not None and corrector.config.M != options.M:
        raise ValueError(f"corrector: built for M = {corrector.config.M}, stride gives {options.M}")
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    request_ids = list(range(len(prompts))) if request_ids is None else list(request_ids)
    if len(seeds) != len(prompts) or len(request_ids) != len(prompts):
        raise ValueError("seeds: need one seed and one request id per prompt")
    outputs = [RequestOutput() for _ in prompts]
    for start in range(0, len(prompts), batch_size):
        rows = range(start, min(start + batch_size, len(prompts)))
        _Batch(
            backbone,
            options,
            corrector,
            [list(prompts[r]) for r in rows],
            [seeds[r] for r in rows],
            [request_ids[r] for r in rows],
            [outputs[r] for r in rows],
            logger,
            list(rows),
            on_finish,
        ).run()
    return DecodeResult(outputs, options.M)


class _Batch:
    """One batch of requests decoded in lock step (each row is a cold start or a verify round)."""

    def __init__(
        self,
        backbone: Backbone,
        options: ISDOptions,
        corrector: Corrector | None,
        prompts: list[list[int]],
        seeds: list[int],
        request_ids: list[int],
        outputs: list[RequestOutput],
        logger: BlockLogger | None,
        indices: list[int],
        on_finish: Callable[[int, RequestOutput], None] | None,
    ) -> None:
        self.indices, self.on_finish = indices, on_finish
        self.bb, self.opt, self.corrector, self.logger = backbone, options, corrector, logger
        self.outputs, self.request_ids = outputs, request_ids
        self.M, B = options.M, len(prompts)
        self.K = (
            corrector.config.K if corrector is not None else min(options.top_k, backbone.vocab_size)
        )
        self.device = torch.device(getattr(backbone, "device", "cpu"))
        self.gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.prompts = prompts
        self.cache = backbone.new_cache()
        self.kv = KVSlots(B, self.device)
        self.pending = torch.tensor([p[-1] for p in prompts], device=self.device)
        self.verify = torch.zeros(B, dtype=torch.bool, device=self.device)
        self.done = torch.zeros(B, dtype=torch.bool, device=self.device)
        self.block_index = [0] * B
        self.drafts: list[tuple[Draft, int, int] | None] = [None] * B  # (draft, row in it, anchor)

    # -- randomness: each row draws from its own generator, in an order fixed by its own path
    def _uniforms(self, rows: Tensor, n: int) -> Tensor:
        return torch.stack([torch.rand(n, generator=self.gens[int(b)]) for b in rows]).to(
            self.device
        )

    def _probs(self, logits: Tensor) -> Tensor:
        """p or q at the decoding temperature (T = 1 for greedy, used only by the logs)."""
        t = self.opt.temperature if self.opt.temperature > 0 else 1.0
        return torch.softmax(logits.float() / t, dim=-1)

    def run(self) -> None:
        self._prefill()
        while not bool(self.done.all()):
            self._round()

    def _forward(self, ids: Tensor, new_valid: Tensor) -> tuple[Tensor, Tensor]:
        mask, positions = self.kv.attention(new_valid)
        out = self.bb.forward(ids, self.cache, position_ids=positions, attention_mask=mask)
        return out.logits.float(), out.hidden

    def _prefill(self) -> None:
        lengths = torch.tensor([len(p) - 1 for p in self.prompts], device=self.device)
        S = int(lengths.max())
        if S == 0:
            return
        ids = torch.full((len(self.prompts), S), self.bb.mask_token_id, device=self.device)
        for b, p in enumerate(self.prompts):
            ids[b, : len(p) - 1] = torch.tensor(p[:-1])
        valid = torch.arange(S, device=self.device)[None] < lengths[:, None]
        self._forward(ids, valid)
        self.kv.append(valid)

    def _round(self) -> None:
        M, S = self.M, 2 * self.M + 1
        live = ~self.done
        ver, cold = self.verify & live, ~self.verify & live
        self.alt_logp: dict[int, float] = {}
        if self.opt.score_blocks and self.logger is not None and bool(ver.any()):
            self._score_alternatives(ver.nonzero()[:, 0].tolist())
        ids = torch.full((len(self.outputs), S), self.bb.mask_token_id, device=self.device)
        ids[:, 0] = self.pending
        for b in ver.nonzero()[:, 0].tolist():
            entry = self.drafts[b]
            assert entry is not None
            ids[b, 1 : M + 1] = entry[0].tokens[entry[1]]
        new_valid = torch.zeros_like(ids, dtype=torch.bool)
        new_valid[ver] = True
        new_valid[cold, : M + 1] = True
        logits, hidden = self._forward(ids, new_valid)
        keep = torch.zeros_like(new_valid)
        to_draft: list[tuple[int, int]] = []  # (row, slot of the first MASK)
        for b in live.nonzero()[:, 0].tolist():
            self.outputs[b].forwards += 1
        vrows = ver.nonzero()[:, 0]
        if len(vrows):
            to_draft += self._verify_rows(vrows, logits, keep)
        crows = cold.nonzero()[:, 0]
        if len(crows):
            to_draft += self._cold_rows(crows, logits, keep)
        self.kv.append(keep)
        self.bb.trim(self.cache, self.kv.compact())
        todo = [(b, slot) for b, slot in to_draft if not self.done[b]]
        if todo:
            self._draft(todo, logits, hidden)

    def _score_alternatives(self, rows: list[int]) -> None:
        """L(b | c) = Σ_i log p(x_i | c, x_<i) of each row's other block, from the prefix c the
        round starts at (a diagnostic forward whose slots are dropped at once)."""
        alt = []
        for b in rows:
            entry = self.drafts[b]
            if entry is not None and entry[0].alt_tokens is not None:
                alt.append((b, entry[0].alt_tokens[entry[1]]))
        if not alt:
            return
        M, B = self.M, len(self.outputs)
        idx = torch.tensor([b for b, _ in alt], device=self.device)
        blocks = torch.stack([t for _, t in alt])
        ids = torch.full((B, M + 1), self.bb.mask_token_id, device=self.device)
        ids[idx, 0] = self.pending[idx]
        ids[idx, 1:] = blocks
        new_valid = torch.zeros_like(ids, dtype=torch.bool)
        new_valid[idx] = True
        logits, _ = self._forward(ids, new_valid)
        self.kv.append(torch.zeros_like(new_valid))
        self.bb.trim(self.cache, self.kv.compact())
        logp = _block_logp(logits[idx, :M], blocks)
        self.alt_logp = dict(zip(idx.tolist(), logp.tolist(), strict=True))

    def _verify_rows(self, rows: Tensor, logits: Tensor, keep: Tensor) -> list[tuple[int, int]]:
        M, greedy = self.M, self.opt.temperature == 0
        drafts = [self.drafts[int(b)] for b in rows]
        tokens = torch.stack([d[0].tokens[d[1]] for d in drafts if d is not None])
        law = _stack_laws([(d[0].law, d[1]) for d in drafts if d is not None])
        p = self._probs(logits[rows, : M + 1])
        need_u = not greedy or self.logger is not None
        u = self._uniforms(rows, M + 1) if need_u else None
        result = verify_chain(
            p,
            tokens,
            law,
            greedy=greedy,
            u=None if u is None else u[:, :M],
            u_next=None if u is None else u[:, M],
        )
        if self.logger is not None:
            logp = self._logged_logp(rows, drafts, logits[rows, :M], tokens)
            self.logger.log(self, rows, drafts, p, result, u, *logp)
        out = []
        for i, b in enumerate(rows.tolist()):
            L, nxt = int(result.accept_len[i]), int(result.next_token[i])
            keep[b, : L + 1] = True
            rec = self.outputs[b]
            rec.accept_lengths.append(L)
            self._commit(b, [*tokens[i, :L].tolist(), nxt])
            self.pending[b] = nxt
            self.block_index[b] += 1
            if L == M:
                rec.cycle_lengths.append(L)
                rec.cycle_tokens += M + 1
                rec.cycle_forwards += 1
                out.append((b, M + 1))
            else:
                rec.open_cycle = (L, L + 1, 1)
                self.verify[b] = False
        return out

    def _logged_logp(
        self, rows: Tensor, drafts: list[Any], logits: Tensor, tokens: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """(base_logp, head_logp) of the round's rows, or (None, None) when not scoring."""
        if not self.opt.score_blocks:
            return None, None
        actual = _block_logp(logits, tokens)  # the verified block, from the round's own forward
        other = torch.tensor([self.alt_logp.get(int(b), float("nan")) for b in rows])
        head_drafted = drafts[0][0].head_drafted
        return (other, actual) if head_drafted else (actual, other)

    def _cold_rows(self, rows: Tensor, logits: Tensor, keep: Tensor) -> list[tuple[int, int]]:
        keep[rows, 0] = True
        if self.opt.temperature == 0:
            nxt = logits[rows, 0].argmax(-1)
        else:
            nxt = sample_inverse_cdf(self._probs(logits[rows, 0]), self._uniforms(rows, 1)[:, 0])
        out = []
        for i, b in enumerate(rows.tolist()):
            rec = self.outputs[b]
            if rec.open_cycle is not None:  # the cold start closes the cycle of a rejection
                L, tokens, forwards = rec.open_cycle
                rec.cycle_lengths.append(L)
                rec.cycle_tokens += tokens + 1
                rec.cycle_forwards += forwards + 1
                rec.open_cycle = None
            self._commit(b, [int(nxt[i])])
            self.pending[b] = nxt[i]
            self.verify[b] = True
            out.append((b, 1))
        return out

    def _commit(self, b: int, tokens: list[int]) -> None:
        rec = self.outputs[b]
        rec.committed += len(tokens)
        eos = self.opt.eos_token_id
        for t in tokens:
            rec.tokens.append(t)
            if eos is not None and t == eos:
                rec.finished = "eos"
                break
            if len(rec.tokens) >= self.opt.max_new_tokens:
                rec.finished = "length"
                break
        if rec.finished:
            self.done[b] = True
            if self.on_finish is not None:
                self.on_finish(self.indices[b], rec)

    def _draft(self, todo: list[tuple[int, int]], logits: Tensor, hidden: Tensor) -> None:
        """Propose the next block for rows ``todo`` from their MASK slots (first at ``slot``)."""
        M, K, temp = self.M, self.K, self.opt.temperature
        rows = torch.tensor([b for b, _ in todo], device=self.device)
        first = torch.tensor([s for _, s in todo], device=self.device)
        span = first[:, None] + torch.arange(M, device=self.device)  # [n, M]
        base_logits = logits[rows[:, None], span]  # [n, M, V]
        mask_hidden = hidden[rows[:, None], span]  # [n, M, H]
        anchor_hidden = hidden[rows, first - 1]  # slot whose logits produced the anchor
        anchor = self.pending[rows]
        q = self._probs(base_logits)
        u = self._uniforms(rows, M) if temp > 0 else None
        head = self.corrector
        alt: Tensor | None = None
        if head is not None and not self.opt.shadow:
            sel = head.select(self.bb, anchor_hidden, anchor, mask_hidden, base_logits, temp, u=u)
            cand_ids, tokens, head_choice = sel.cand_ids, sel.tokens, sel.ranks
            law = (
                ProposalLaw.point_mass()
                if temp == 0
                else ProposalLaw.candidates(sel.probs, cand_ids)
            )
            base_choice = _base_rank(q.gather(-1, cand_ids), u)
            alt = cand_ids.gather(-1, base_choice[..., None])[..., 0]  # the base's whole block
        else:
            cand_ids = base_logits.topk(K, dim=-1).indices
            if temp == 0:
                tokens, law = base_logits.argmax(-1), ProposalLaw.point_mass()
                base_choice = torch.zeros_like(tokens)
            else:  # a draw from q restricted to C_i, which is then the law π
                q_cand = q.gather(-1, cand_ids)
                q_cand = q_cand / q_cand.sum(-1, keepdim=True)
                base_choice = _base_rank(q_cand, u)
                tokens = cand_ids.gather(-1, base_choice[..., None])[..., 0]
                law = ProposalLaw.candidates(q_cand, cand_ids)
            head_choice = torch.full_like(base_choice, -1)
            if head is not None:  # shadow: the head's choice on the base's own prefix
                refined = head(self.bb, anchor_hidden, anchor, mask_hidden,
                               base_logits.gather(-1, cand_ids), cand_ids, tokens)  # fmt: skip
                head_choice = _select(refined, temp, u)
                if self.opt.score_blocks:  # the head's own free-running block, for ΔL
                    free = head.select(self.bb, anchor_hidden, anchor, mask_hidden, base_logits,
                                       temp, u=u)  # fmt: skip
                    alt = free.tokens
        drafted_by_head = head is not None and not self.opt.shadow
        draft = Draft(tokens, law, cand_ids, q.gather(-1, cand_ids), base_choice, head_choice,
                      head_drafted=drafted_by_head, alt_tokens=alt)  # fmt: skip
        for i, b in enumerate(rows.tolist()):
            self.drafts[b] = (draft, i, int(anchor[i]))


def _block_logp(logits: Tensor, blocks: Tensor) -> Tensor:
    """Σ_i log p(x_i | ·) at temperature 1 (eq. 9): logits ``[n, M, V]``, blocks ``[n, M]``."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(-1, blocks[..., None])[..., 0].sum(-1)


def _select(logits: Tensor, temperature: float, u: Tensor | None) -> Tensor:
    """Argmax, or the inverse-CDF draw from softmax(logits / T) with uniforms u. [n, M]"""
    if temperature == 0 or u is None:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    flat = sample_inverse_cdf(probs.reshape(-1, probs.shape[-1]), u.reshape(-1))
    return flat.reshape(u.shape)


def _base_rank(q_cand: Tensor, u: Tensor | None) -> Tensor:
    """The base's choice at the head's state: argmax, or q restricted to C_i drawn with the
    head's own uniform (so identical laws give identical choices)."""
    if u is None:
        return torch.zeros(q_cand.shape[:-1], dtype=torch.long, device=q_cand.device)
    flat = sample_inverse_cdf(q_cand.reshape(-1, q_cand.shape[-1]), u.reshape(-1))
    return flat.reshape(u.shape)


def _stack_laws(laws: list[tuple[ProposalLaw, int]]) -> ProposalLaw:
    """Gather the rows' proposal laws into one batch law (they share a kind within a run)."""
    first = laws[0][0]
    if first.probs is None:
        return ProposalLaw.point_mass()
    probs = torch.stack([law.probs[i] for law, i in laws])  # type: ignore[index]
    if first.cand_ids is None:
        return ProposalLaw.full(probs)
    cand = torch.stack([law.cand_ids[i] for law, i in laws])  # type: ignore[index]
    return ProposalLaw.candidates(probs, cand)
