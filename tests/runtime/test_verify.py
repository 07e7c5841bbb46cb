"""Exactness of the one verifier, the one the step runs (:func:`brisk.runtime.isd.batched.
verify_block`): sampled outputs follow the verifier's autoregressive law.

The target is a random Markov chain over V tokens, p(y_t | y_{t−1}) = P[y_{t−1}] (given to the
verifier as logits log P at temperature 1), so p at draft position i depends on the draft tokens
before it (and is only the right law when they were accepted). The drafter runs its own chain
Q; three proposal laws π are tested, each as the :class:`~brisk.runtime.isd.batched.Draft` the
step would verify: (a) the full softmax Q (K = V candidates), (b) the point mass on argmax Q (a
one-hot over Q's Top-K, as greedy drafting proposes), (c) a softmax of other logits restricted
to the Top-K of Q, its candidates shuffled per row (the corrector reordering them). Two
verification rounds give each row its first two output tokens (a row that rejects at once
commits one token in round 1). Their empirical law over n = 200,000 rows is compared with
J[a, b] = P[s, a]·P[a, b]:

* every cell within 5σ, σ = sqrt(J(1−J)/n) (cells with J = 0 must stay empty);
* total variation ½Σ|Ĵ − J| below τ + t, where E[TV] ≤ ½Σ sqrt(J(1−J)/n) =: τ (Jensen, per
  cell) and TV moves by at most 1/n when one sample changes, so by McDiarmid
  P(TV > E[TV] + t) ≤ exp(−2 n t²) = 1e−6 for t = sqrt(ln(1e6) / 2n) ≈ 0.0059.

A negative control shows the test has power: verifying argmax drafts against the full softmax
(the approximately lossless shortcut in the I-DLM fork) fails the same TV bound.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch

from brisk.runtime.isd import ISDOptions
from brisk.runtime.isd.batched import Draft, StepContext, init_state, propose, step, verify_block
from brisk.theory import AcceptanceProfile

V, M, K, N_SAMPLES, START = 6, 3, 3, 200_000, 0


def _chains(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(1.5 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    P[:, V - 1] = 0.0  # a token the target never emits: the residual must never produce it
    P = P / P.sum(-1, keepdim=True)
    Q = torch.softmax(1.5 * torch.randn(V, V, generator=g, dtype=torch.float64), -1)
    R = 1.5 * torch.randn(V, V, generator=g, dtype=torch.float64)  # corrector logits
    return P, Q, R


P, Q, R = _chains()


def _draft(tokens: torch.Tensor, cand_ids: torch.Tensor, law: torch.Tensor) -> Draft:
    """The block the step verifies: ``tokens [B, M]`` drawn from ``law [B, M, K]`` over
    ``cand_ids [B, M, K]``; the log-only fields are placeholders the verifier never reads."""
    ranks = (cand_ids == tokens[..., None]).long().argmax(-1)
    none = torch.full_like(tokens, -1)
    return Draft(
        tokens=tokens,
        ranks=ranks,
        cand_ids=cand_ids,
        law=law,
        anchor=tokens[:, 0],
        offset=tokens[:, 0],
        base_choice=ranks,
        head_choice=none,
        head_block=none,
    )


def _full_law(tokens: torch.Tensor, laws: torch.Tensor) -> Draft:
    """A full law ``[B, M, V]``: every token a candidate, in id order."""
    vocab = laws.shape[-1]
    return _draft(tokens, torch.arange(vocab).expand(*tokens.shape, vocab), laws)


def _draft_full(ctx: torch.Tensor, g: torch.Generator) -> Draft:
    drafts, laws, prev = [], [], ctx
    for _ in range(M):
        law = Q[prev]
        prev = torch.multinomial(law, 1, generator=g)[:, 0]
        drafts.append(prev)
        laws.append(law)
    return _full_law(torch.stack(drafts, 1), torch.stack(laws, 1))


def _draft_argmax(ctx: torch.Tensor, g: torch.Generator) -> Draft:
    drafts, ids, prev = [], [], ctx
    for _ in range(M):
        cand = Q[prev].topk(K, -1).indices
        prev = cand[:, 0]
        drafts.append(prev)
        ids.append(cand)
    law = torch.zeros(len(ctx), M, K, dtype=torch.float64)
    law[..., 0] = 1.0  # a point mass on the argmax
    return _draft(torch.stack(drafts, 1), torch.stack(ids, 1), law)


def _draft_topk(ctx: torch.Tensor, g: torch.Generator) -> Draft:
    drafts, laws, ids, prev = [], [], [], ctx
    for _ in range(M):
        cand = Q[prev].topk(K, -1).indices  # [B, K] ordered by q
        shuffle = torch.rand(cand.shape, generator=g).argsort(-1)
        cand = cand.gather(-1, shuffle)  # the corrector reorders candidates
        law = torch.softmax(R[prev[:, None], cand], -1)  # [B, K]
        pick = torch.multinomial(law, 1, generator=g)[:, 0]
        prev = cand.gather(-1, pick[:, None])[:, 0]
        drafts.append(prev)
        laws.append(law)
        ids.append(cand)
    return _draft(torch.stack(drafts, 1), torch.stack(ids, 1), torch.stack(laws, 1))


def _target(ctx: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """Logits log p ``[B, M+1, V]``: row i conditions on the token before it (context, then
    drafts); log 0 = −inf is p's zero column."""
    prev = torch.cat([ctx[:, None], draft], 1)  # [B, M+1]
    return P[prev].log()


def _verify(
    ctx: torch.Tensor, draft: Draft, g: torch.Generator, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """L and the next token, uniforms from ``g`` in the step's layout ``[next, accept × M]``."""
    u = torch.rand(len(ctx), M + 1, generator=g, dtype=torch.float64)
    return verify_block(
        _target(ctx, draft.tokens), draft, 0.0 if greedy else 1.0, u[:, 1:], u[:, 0]
    )


def _first_two(
    drafter: Callable[[torch.Tensor, torch.Generator], Draft],
    n: int,
    greedy: bool = False,
    wrong_law: bool = False,
    seed: int = 0,
) -> torch.Tensor:
    """Output tokens 1 and 2 of n independent decodes from START: ``[n, 2]``."""
    g = torch.Generator().manual_seed(seed)

    def round_(ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        draft = drafter(ctx, g)
        if wrong_law:  # argmax drafts verified as if sampled from the full softmax
            prev = torch.cat([ctx[:, None], draft.tokens[:, :-1]], 1)
            draft = _full_law(draft.tokens, Q[prev])
        L, nxt = _verify(ctx, draft, g, greedy)
        return draft.tokens, L, nxt

    draft, L, nxt = round_(torch.full((n,), START))
    # Only rows with L = 0 need round 2, whose context is their correction token.
    draft2, L2, nxt2 = round_(nxt)
    first2 = torch.where(L2 >= 1, draft2[:, 0], nxt2)
    first = torch.where(L >= 1, draft[:, 0], nxt)
    second = torch.where(L >= 2, draft[:, 1], torch.where(L == 1, nxt, first2))
    return torch.stack([first, second], 1)


def _joint(out: torch.Tensor) -> torch.Tensor:
    return torch.bincount(out[:, 0] * V + out[:, 1], minlength=V * V).double() / len(out)


EXPECTED = (P[START][:, None] * P).reshape(-1)  # J[a, b] = P[s, a] P[a, b]
SIGMA = (EXPECTED * (1 - EXPECTED) / N_SAMPLES).sqrt()
TV_BOUND = 0.5 * float(SIGMA.sum()) + math.sqrt(math.log(1e6) / (2 * N_SAMPLES))

CASES = [
    pytest.param(_draft_full, id="full-softmax"),
    pytest.param(_draft_argmax, id="argmax-point-mass"),
    pytest.param(_draft_topk, id=f"top{K}-shuffled-softmax"),
]


@pytest.mark.parametrize("drafter", CASES)
def test_sampled_outputs_follow_the_autoregressive_target(drafter: Callable) -> None:
    emp = _joint(_first_two(drafter, N_SAMPLES))
    z = (emp - EXPECTED).abs() / SIGMA.clamp(min=1e-300)
    zero = EXPECTED == 0
    assert bool((emp[zero] == 0).all()), "a token with zero target probability was emitted"
    worst = int(z[~zero].argmax())
    assert float(z[~zero].max()) < 5, f"cell {divmod(worst, V)}: {float(z[~zero].max()):.2f} σ"
    tv = 0.5 * float((emp - EXPECTED).abs().sum())
    print(f"n={N_SAMPLES} max|z|={float(z[~zero].max()):.2f}σ TV={tv:.5f} bound={TV_BOUND:.5f}")
    assert tv < TV_BOUND, f"TV {tv:.5f} ≥ bound {TV_BOUND:.5f}"


def test_the_tv_bound_catches_an_approximate_verifier() -> None:
    emp = _joint(_first_two(_draft_argmax, N_SAMPLES, wrong_law=True))
    tv = 0.5 * float((emp - EXPECTED).abs().sum())
    print(f"approximate verifier: TV={tv:.5f} vs bound {TV_BOUND:.5f}")
    assert tv > 3 * TV_BOUND, f"TV {tv:.5f} should exceed the bound {TV_BOUND:.5f} clearly"


@pytest.mark.parametrize("drafter", CASES)
def test_greedy_outputs_are_the_greedy_chain(drafter: Callable) -> None:
    out = _first_two(drafter, 20_000, greedy=True)
    a = int(P[START].argmax())
    expected = torch.tensor([a, int(P[a].argmax())]).expand_as(out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_greedy_accept_lengths_by_hand() -> None:
    """Through the whole step: what it commits is the accepted drafts, then the next token."""
    p = torch.zeros(3, 4, 5, dtype=torch.float64)
    argmaxes = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    p.scatter_(-1, argmaxes[..., None], 1.0)
    tokens = torch.tensor([[1, 2, 3], [1, 0, 3], [0, 2, 3]])
    draft = _full_law(tokens, torch.nn.functional.one_hot(tokens, 5).double())
    L, nxt = verify_block(p, draft, 0.0, torch.zeros(3, 3), torch.zeros(3))
    torch.testing.assert_close(L, torch.tensor([3, 1, 0]), rtol=0, atol=0)
    torch.testing.assert_close(nxt, torch.tensor([4, 2, 1]), rtol=0, atol=0)

    ctx = StepContext(ISDOptions(stride=M + 1, max_new_tokens=8), K=2)
    state = init_state(tokens[:, 0], torch.full((3,), 4), torch.zeros(3), torch.arange(3), ctx)
    state = dataclasses.replace(state, verify=torch.ones(3, dtype=torch.bool), draft=draft)
    logits = torch.cat([p, torch.zeros(3, M, 5, dtype=torch.float64)], 1)  # + the MASK slots
    res = step(state, logits, torch.zeros(3, 2 * M + 1, 8), ctx)
    assert res.committed() == [[1, 2, 3, 4], [1, 2], [1]]
    reached = AcceptanceProfile.from_accept_lengths(res.accept_len.numpy(), M=M).reached
    assert reached.tolist() == [3, 2, 1]


def test_candidate_law_equals_its_dense_form_and_is_deterministic() -> None:
    g = torch.Generator().manual_seed(3)
    ctx = torch.randint(0, V, (5000,), generator=g)
    draft = _draft_topk(ctx, g)
    dense = _full_law(
        draft.tokens,
        torch.zeros(5000, M, V, dtype=torch.float64).scatter_add_(-1, draft.cand_ids, draft.law),
    )
    runs = [_verify(ctx, d, torch.Generator().manual_seed(11)) for d in (draft, dense, draft)]
    for L, nxt in runs[1:]:
        torch.testing.assert_close(L, runs[0][0], rtol=0, atol=0)
        torch.testing.assert_close(nxt, runs[0][1], rtol=0, atol=0)


def test_acceptance_rate_is_min_one_p_over_pi() -> None:
    """One position, point mass: accept w.p. p(x); logged uniforms reproduce the decision."""
    p = torch.tensor([[[0.3, 0.7, 0.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    draft = _draft(torch.tensor([[1]]), torch.tensor([[[1]]]), torch.ones(1, 1, 1))
    for u, accepted in ((0.69, 1), (0.71, 0)):
        for u_next in (0.0, 0.5, 0.999):
            L, nxt = verify_block(p.log(), draft, 1.0, torch.tensor([[u]]), torch.tensor([u_next]))
            assert int(L) == accepted
            assert int(nxt) == 0  # the bonus row, or the residual [p − δ_1]₊ ∝ δ_0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param("logits", torch.zeros(2, 3, 4), "logits:", id="logits-rows"),
        pytest.param(
            "tokens", torch.zeros(2, 3, 1, dtype=torch.long), "draft.tokens:", id="draft-ndim"
        ),
        pytest.param("ranks", torch.zeros(2, 2, dtype=torch.long), "draft.ranks:", id="ranks"),
        pytest.param(
            "cand_ids",
            torch.zeros(2, 2, 2, dtype=torch.long),
            "draft.cand_ids:",
            id="candidates-rows",
        ),
        pytest.param("law", torch.full((2, 3, 3), 1 / 3), "draft.law:", id="law-vs-candidates"),
        pytest.param("u_accept", torch.zeros(2, 2), "u_accept:", id="u-accept"),
        pytest.param("u_next", torch.zeros(2, 1), "u_next:", id="u-next"),
    ],
)
def test_bad_shapes_raise(field: str, value: torch.Tensor, message: str) -> None:
    """One malformed argument of a round with B = 2, M = 3, K = 2, V = 4."""
    tokens = torch.zeros(2, 3, dtype=torch.long)
    draft = _draft(tokens, torch.zeros(2, 3, 2, dtype=torch.long), torch.full((2, 3, 2), 0.5))
    args = {"logits": torch.zeros(2, 4, 4), "u_accept": torch.zeros(2, 3), "u_next": torch.zeros(2)}
    if field in args:
        args[field] = value
    else:
        draft = dataclasses.replace(draft, **{field: value})
    for temperature in (0.0, 1.0):  # greedy rounds are checked too
        with pytest.raises(ValueError, match=message):
            verify_block(args["logits"], draft, temperature, args["u_accept"], args["u_next"])


def test_a_draft_outside_the_vocabulary_raises() -> None:
    """Token ids are not checked on the host (that would synchronize with the device every
    round); an id past V still cannot pass silently: reading p at it fails."""
    draft = _full_law(torch.tensor([[9]]), torch.full((1, 1, 3), 1 / 3))
    with pytest.raises(RuntimeError, match="out of bounds"):
        verify_block(torch.zeros(1, 2, 3), draft, 1.0, torch.zeros(1, 1), torch.zeros(1))


def test_proposals_give_their_draft_positive_mass() -> None:
    """π_i(x_i) > 0 is what verification divides by (module docstring of the step). The
    proposal's law underflows to exact zeros on candidates far below the top (float32 logits
    200 apart), and uniforms at both ends of (0, 1) must still pick a candidate of positive
    mass: a draft outside its law would be accepted with probability 1."""
    B, Kp = 4096, 5
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(B, M, 16, generator=g) * torch.tensor([200.0, 1.0, 0.01])[:, None]
    u = torch.rand(B, M, generator=g, dtype=torch.float64)
    u[:8], u[8:16] = 1e-12, 1 - 1e-12
    ctx = StepContext(ISDOptions(stride=M + 1, temperature=1.0, max_new_tokens=8), K=Kp)
    hidden = torch.zeros(B, M, 4)
    draft = propose(
        logits,
        hidden,
        hidden[:, 0],
        torch.zeros(B, dtype=torch.long),
        torch.zeros(B, dtype=torch.long),
        u,
        ctx,
    )
    assert bool((draft.law == 0).any()), "the edge case needs a law with zero mass"
    assert bool((draft.law.gather(-1, draft.ranks[..., None]) > 0).all())
    torch.testing.assert_close(
        draft.tokens, draft.cand_ids.gather(-1, draft.ranks[..., None])[..., 0], rtol=0, atol=0
    )


def test_acceptance_rate_matches_the_overlap_of_p_and_pi() -> None:
    """a_1 = Σ_v min(p_1(v), π_1(v)) (= 1 − TV(p_1, π_1)); the profile's MLE is within 5σ."""
    n = N_SAMPLES
    g = torch.Generator().manual_seed(5)
    ctx = torch.full((n,), START)
    L, _ = _verify(ctx, _draft_full(ctx, g), g)
    a1 = float(torch.minimum(P[START], Q[START]).sum())
    measured = float(AcceptanceProfile.from_accept_lengths(L.numpy(), M=M).rates()[0])
    assert abs(measured - a1) < 5 * math.sqrt(a1 * (1 - a1) / n), (measured, a1)
