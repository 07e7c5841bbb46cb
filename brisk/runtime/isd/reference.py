"""The single-request ISD loop, written to be read: the independent twin the batched step is
tested against.

Like gpt-fast's ``speculative_decode``: one request, Python ints, one forward per round on a
dense KV cache. Proposal, verification and correction are written here again, position by
position, from the paper (sec:idlm_background, eq:head_residual_logits), sharing nothing with
:mod:`brisk.runtime.isd.batched` but the uniforms (same seed, request id, forward counter and
slot layout ``[next, accept × M, draft × M]``), so a bug cannot sit on both sides of the parity
test. For any request its tokens, accept lengths and forward count equal the batched loop's.

The prefill runs the whole prompt and commits the first token (a draw from p at the prompt's
last position with the uniforms of forward 0); then a round feeds ``[pending, x_1..x_M,
MASK×M]`` (verify) or ``[pending, MASK×M]`` (cold start, the first round and every round after a
rejection). Every forward, the prefill included, counts in ``forwards``.

- **verify**: p_i is the verifier's law at slot i − 1 (temperature T; greedy: its argmax).
  x_i is accepted iff u_i · π_i(x_i) < p_i(x_i), in order, until the first rejection (greedy:
  iff x_i = argmax p_i); L = the number accepted. L = M commits x_1..x_M and a bonus token from
  p_{M+1}; L < M commits x_1..x_L and a correction from normalize([p_{L+1} − π_{L+1}]₊)
  (p_{L+1} itself if that is zero), then the next round is a cold start.
- **cold start**: the next token from p at slot 0.
- **proposal** (after a cold start or a full acceptance): for j = 1..M the MASK slot's logits
  give the Top-K candidates C_j (descending); the base draws x_j from q_j restricted to C_j and
  renormalized (π_j; greedy: the top candidate), the corrector (when given) chooses over C_j
  left to right with its own law.
- A draw with uniform u from weights w is the inverse CDF: the first index whose cumulative
  weight exceeds u · Σw, never an index of zero weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from brisk.runtime.backbone import Backbone
from brisk.runtime.corrector import Corrector, CorrectorInputs
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.result import RequestOutput
from brisk.runtime.sampling import counter_uniforms

__all__ = ["reference_decode"]


@dataclass
class _Block:
    tokens: list[int]  # x_1..x_M
    ranks: list[int]  # index of x_j in C_j
    candidates: Tensor  # [M, K] C_j
    law: Tensor  # [M, K] π_j over C_j


def _draw(weights: Tensor, u: Tensor) -> int:
    """Inverse-CDF draw from unnormalized ``weights [V]`` with the uniform ``u``."""
    cdf = weights.cumsum(0)
    above = (cdf > u.to(cdf.dtype) * cdf[-1]).nonzero()
    index = int(above[0]) if len(above) else len(weights) - 1
    return min(index, int((weights > 0).nonzero()[-1]))


def _law(logits: Tensor, T: float) -> Tensor:
    """softmax(logits / T) (T = 0: at temperature 1, for the argmax)."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    return torch.softmax(x / (T if T > 0 else 1.0), dim=-1)


def _choose(p: Tensor, T: float, u: Tensor) -> int:
    return int(p.argmax()) if T == 0 else _draw(p, u)


def _verify(logits: Tensor, block: _Block, T: float, u: Tensor) -> tuple[int, int]:
    """L and the next token from the verify logits ``[M + 1, V]`` (module docstring)."""
    M = len(block.tokens)
    p = _law(logits, T)
    L = 0
    for i, x in enumerate(block.tokens):
        if T == 0:
            ok = x == int(p[i].argmax())
        else:
            pi_x = block.law[i, block.ranks[i]].to(p.dtype)
            ok = bool(u[1 + i].to(p.dtype) * pi_x < p[i, x])
        if not ok:
            break
        L += 1
    if T == 0:
        return L, int(p[L].argmax())
    if L == M:  # bonus token
        return L, _draw(p[M], u[0])
    residual = p[L].clone()
    residual[block.candidates[L]] -= block.law[L].to(p.dtype)
    residual = residual.clamp(min=0)
    return L, _draw(residual if bool(residual.sum() > 0) else p[L], u[0])


def _propose(
    logits: Tensor,
    hidden: Tensor,
    anchor_hidden: Tensor,
    anchor: int,
    u: Tensor,
    K: int,
    T: float,
    backbone: Backbone,
    corrector: Corrector | None,
    shadow: bool,
) -> _Block:
    """The next block from the M MASK slots' ``logits [M, V]`` and ``hidden [M, H]``."""
    cand_logits, candidates = logits.topk(K, dim=-1)
    if corrector is not None and not shadow:
        block = CorrectorInputs(
            anchor_hidden=anchor_hidden[None],
            anchor_ids=torch.tensor([anchor]),
            mask_hidden=hidden[None],
            cand_logits=cand_logits[None],
            cand_ids=candidates[None],
            u=u[None] if T > 0 else None,
        )
        sel = corrector.select(backbone, block, T)
        ranks, law = sel.ranks[0].tolist(), sel.probs[0]
    else:
        law = _law(cand_logits, T)
        ranks = [0 if T == 0 else _draw(law[j], u[j]) for j in range(len(law))]
    tokens = [int(candidates[j, r]) for j, r in enumerate(ranks)]
    return _Block(tokens, ranks, candidates, law)


@torch.inference_mode()
def reference_decode(
    backbone: Backbone,
    prompt: Sequence[int],
    options: ISDOptions,
    *,
    corrector: Corrector | None = None,
    seed: int = 0,
    request_id: int = 0,
) -> RequestOutput:
    M, T, mask = options.M, options.temperature, backbone.mask_token_id
    K = corrector.config.K if corrector is not None else min(options.top_k, backbone.vocab_size)
    out = RequestOutput()
    cache = backbone.new_cache()

    def uniforms() -> Tensor:  # this forward's [next, accept × M, draft × M]
        keys = (torch.tensor([x]) for x in (seed, request_id, out.forwards))
        return counter_uniforms(*keys, 1 + 2 * M)[0]

    def emit(committed: list[int]) -> None:  # cut at EOS (kept) or at the token budget
        out.forwards += 1
        out.committed += len(committed)
        for t in committed:
            out.tokens.append(t)
            if t == options.eos_token_id:
                out.finished = "eos"
            elif len(out.tokens) >= options.max_new_tokens:
                out.finished = "length"
            if out.finished:
                return

    # prefill: the whole prompt; its last logits give the first token
    u = uniforms()
    emit(
        [
            _choose(
                _law(backbone.forward(torch.tensor([list(prompt)]), cache).logits[0, -1], T),
                T,
                u[0],
            )
        ]
    )
    pending, block = out.tokens[-1], None  # block: the drafts to verify (None → cold start)
    while not out.finished:
        u = uniforms()
        length = backbone.cache_length(cache)
        drafts = [] if block is None else block.tokens
        fwd = backbone.forward(torch.tensor([[pending, *drafts, *[mask] * M]]), cache)
        logits, hidden = fwd.logits[0], fwd.hidden[0]
        if block is None:  # cold start: slot 0 gives the next token, slots 1..M the proposals
            committed = [_choose(_law(logits[0], T), T, u[0])]
            first, full = 1, True
        else:  # verify round: slots 0..M give p_1..p_{M+1}
            L, nxt = _verify(logits[: M + 1], block, T, u)
            out.accept_lengths.append(L)
            committed = [*drafts[:L], nxt]
            first, full = M + 1, L == M
        backbone.trim(cache, length + len(committed))  # keep pending and the accepted drafts
        emit(committed)
        pending = committed[-1]
        block = None
        if full and not out.finished:  # the MASK slots propose the next block
            block = _propose(
                logits[first : first + M],
                hidden[first : first + M],
                hidden[first - 1],
                pending,
                u[1 + M :],
                K,
                T,
                backbone,
                corrector,
                options.shadow,
            )
    return out
