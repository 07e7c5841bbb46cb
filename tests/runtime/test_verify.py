"""Exactness of chain verification: sampled outputs follow the verifier's autoregressive law.

The target is a random Markov chain over V tokens, p(y_t | y_{t−1}) = P[y_{t−1}], so p at draft
position i depends on the draft tokens before it (and is only the right law when they were
accepted). The drafter runs its own chain Q; three proposal laws π are tested: (a) the full
softmax Q, (b) the point mass on argmax Q, (c) a softmax of other logits restricted to the Top-K
of Q, its candidates shuffled per row. Two verification rounds give each row its first two output
tokens (a row that rejects at once commits one token in round 1). Their empirical law over
n = 200,000 rows is compared with J[a, b] = P[s, a]·P[a, b]:

* every cell within 5σ, σ = sqrt(J(1−J)/n) (cells with J = 0 must stay empty);
* total variation ½Σ|Ĵ − J| below τ + t, where E[TV] ≤ ½Σ sqrt(J(1−J)/n) =: τ (Jensen, per
  cell) and TV moves by at most 1/n when one sample changes, so by McDiarmid
  P(TV > E[TV] + t) ≤ exp(−2 n t²) = 1e−6 for t = sqrt(ln(1e6) / 2n) ≈ 0.0059.

A negative control shows the test has power: verifying argmax drafts against the full softmax
(the approximately lossless shortcut in the I-DLM fork) fails the same TV bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from brisk.runtime.verify import ProposalLaw, verify_chain

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


def _draft_full(ctx: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, ProposalLaw]:
    drafts, laws, prev = [], [], ctx
    for _ in range(M):
        law = Q[prev]
        prev = torch.multinomial(law, 1, generator=g)[:, 0]
        drafts.append(prev)
        laws.append(law)
    return torch.stack(drafts, 1), ProposalLaw.full(torch.stack(laws, 1))


def _draft_argmax(ctx: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, ProposalLaw]:
    drafts, prev = [], ctx
    for _ in range(M):
        prev = Q[prev].argmax(-1)
        drafts.append(prev)
    return torch.stack(drafts, 1), ProposalLaw.point_mass()


def _draft_topk(ctx: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, ProposalLaw]:
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
    return torch.stack(drafts, 1), ProposalLaw.candidates(torch.stack(laws, 1), torch.stack(ids, 1))


def _target(ctx: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """p [B, M+1, V]: row i conditions on the token before it (context, then drafts)."""
    prev = torch.cat([ctx[:, None], draft], 1)  # [B, M+1]
    return P[prev]


def _first_two(
    drafter: Callable[[torch.Tensor, torch.Generator], tuple[torch.Tensor, ProposalLaw]],
    n: int,
    greedy: bool = False,
    wrong_law: bool = False,
    seed: int = 0,
) -> torch.Tensor:
    """Output tokens 1 and 2 of n independent decodes from START: ``[n, 2]``."""
    g = torch.Generator().manual_seed(seed)

    def round_(ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        draft, law = drafter(ctx, g)
        if wrong_law:  # argmax drafts verified as if sampled from the full softmax
            law = ProposalLaw.full(Q[torch.cat([ctx[:, None], draft[:, :-1]], 1)])
        res = verify_chain(_target(ctx, draft), draft, law, greedy=greedy, generator=g)
        return draft, res.accept_len, res.next_token

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
    p = torch.zeros(3, 4, 5, dtype=torch.float64)
    argmaxes = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    p.scatter_(-1, argmaxes[..., None], 1.0)
    draft = torch.tensor([[1, 2, 3], [1, 0, 3], [0, 2, 3]])
    res = verify_chain(p, draft, ProposalLaw.point_mass(), greedy=True)
    torch.testing.assert_close(res.accept_len, torch.tensor([3, 1, 0]), rtol=0, atol=0)
    torch.testing.assert_close(res.next_token, torch.tensor([4, 2, 1]), rtol=0, atol=0)
    assert res.tokens(draft) == [[1, 2, 3, 4], [1, 2], [1]]
    assert res.profile().reached.tolist() == [3, 2, 1]


def test_candidate_law_equals_its_dense_form_and_is_deterministic() -> None:
    g = torch.Generator().manual_seed(3)
    ctx = torch.randint(0, V, (5000,), generator=g)
    draft, law = _draft_topk(ctx, g)
    dense = ProposalLaw.full(law.dense(draft, V, torch.float64))
    p = _target(ctx, draft)
    runs = [
        verify_chain(p, draft, lw, generator=torch.Generator().manual_seed(11))
        for lw in (law, dense, law)
    ]
    for other in runs[1:]:
        torch.testing.assert_close(other.accept_len, runs[0].accept_len, rtol=0, atol=0)
        torch.testing.assert_close(other.next_token, runs[0].next_token, rtol=0, atol=0)


def test_acceptance_rate_is_min_one_p_over_pi() -> None:
    """One position, point mass: accept w.p. p(x); logged uniforms reproduce the decision."""
    p = torch.tensor([[[0.3, 0.7, 0.0], [1.0, 0.0, 0.0]]], dtype=torch.float64)
    draft = torch.tensor([[1]])
    for u, accepted in ((0.69, 1), (0.71, 0)):
        res = verify_chain(p, draft, ProposalLaw.point_mass(), u=torch.tensor([[u]]))
        assert int(res.accept_len) == accepted
        assert int(res.next_token) == 0  # the bonus row, or the residual [p − δ_1]₊ ∝ δ_0


@pytest.mark.parametrize(
    ("p_shape", "draft", "message"),
    [
        pytest.param((2, 3, 4), torch.zeros(2, 3, dtype=torch.long), "p:", id="p-rows"),
        pytest.param((2, 4, 4), torch.full((2, 3), 9), "draft:", id="draft-range"),
        pytest.param((2, 4, 4), torch.zeros(2, 3, 1, dtype=torch.long), "draft:", id="draft-ndim"),
    ],
)
def test_bad_shapes_raise(p_shape: tuple[int, ...], draft: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verify_chain(torch.full(p_shape, 0.25), draft, ProposalLaw.point_mass())


def test_draft_outside_its_law_raises() -> None:
    p = torch.full((1, 2, 3), 1 / 3)
    law = ProposalLaw.full(torch.tensor([[[1.0, 0.0, 0.0]]]))
    with pytest.raises(ValueError, match="pi:"):
        verify_chain(p, torch.tensor([[2]]), law)


def test_acceptance_rate_matches_the_overlap_of_p_and_pi() -> None:
    """a_1 = Σ_v min(p_1(v), π_1(v)) (= 1 − TV(p_1, π_1)); the profile's MLE is within 5σ."""
    n = N_SAMPLES
    g = torch.Generator().manual_seed(5)
    ctx = torch.full((n,), START)
    draft, law = _draft_full(ctx, g)
    res = verify_chain(_target(ctx, draft), draft, law, generator=g)
    a1 = float(torch.minimum(P[START], Q[START]).sum())
    measured = float(res.profile().rates()[0])
    assert abs(measured - a1) < 5 * math.sqrt(a1 * (1 - a1) / n), (measured, a1)
