"""The batched tensor step against its single-request reference twin, and its randomness.

The model is the float64 micro Qwen3 of ``test_isd`` (so no rounding difference between a
batched forward over padded slots and a lone one can flip a decision): for every request the
batched loop and :func:`reference_decode` must give the same tokens, accept lengths, forward
counts and committed counts — exact integer parity.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from brisk.runtime import sampling
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.isd import ISDOptions, decode, reference_decode
from brisk.runtime.sampling import Slots, counter_uniforms, sample_inverse_cdf

from .test_isd import MASK, micro_backbone, random_corrector


@pytest.fixture(scope="module")
def backbone64() -> HFBackbone:
    backbone = micro_backbone(seed=3)
    backbone.model.double()
    return backbone


CASES = [
    pytest.param(
        N, T, head, id=f"N{N}-{'greedy' if T == 0 else 'T1'}-head-{'on' if head else 'off'}"
    )
    for N in (2, 4, 8)
    for T in (0.0, 1.0)
    for head in (False, True)
]


@pytest.mark.parametrize(("stride", "temperature", "with_head"), CASES)
def test_batched_step_equals_the_single_request_reference(
    backbone64: HFBackbone, stride: int, temperature: float, with_head: bool
) -> None:
    g = torch.Generator().manual_seed(stride)
    prompts = [
        torch.randint(0, MASK, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(12)
    ]
    head = random_corrector(stride - 1, K=4).double() if with_head else None
    options = ISDOptions(stride=stride, temperature=temperature, max_new_tokens=24, eos_token_id=3)
    seeds, ids = [1000 + 7 * i for i in range(12)], [50 + i for i in range(12)]
    batched = decode(
        backbone64, prompts, options, corrector=head, seeds=seeds, request_ids=ids, batch_size=5
    )
    for i, prompt in enumerate(prompts):
        ref = reference_decode(
            backbone64, prompt, options, corrector=head, seed=seeds[i], request_id=ids[i]
        )
        got = batched.requests[i]
        assert got.tokens == ref.tokens, i
        assert got.accept_lengths == ref.accept_lengths, i
        counts = (got.forwards, got.committed, got.finished)
        assert counts == (ref.forwards, ref.committed, ref.finished), i
    rounds = [L for r in batched.requests for L in r.accept_lengths]
    assert len(rounds) > 20  # verify rounds really ran


def test_each_uniform_the_output_uses_is_fresh(
    backbone: HFBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every forward of a request draws from its own (seed, request, counter) row of uniforms,
    and within a row each slot feeds one decision (:class:`Slots`): recording the keys the
    batched loop asks for shows no (seed, request, counter) twice and counters 0..forwards − 1."""
    keys: list[tuple[int, int, int]] = []
    original = counter_uniforms

    def recording(seed: torch.Tensor, request: torch.Tensor, counter: torch.Tensor, n: int):  # type: ignore[no-untyped-def]
        keys.extend(zip(seed.tolist(), request.tolist(), counter.tolist(), strict=True))
        return original(seed, request, counter, n)

    monkeypatch.setattr("brisk.runtime.isd.state.counter_uniforms", recording)
    prompts = [[1, 2], [3, 4, 5], [6]]
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=12)
    out = decode(backbone, prompts, options, seeds=[5, 5, 6], request_ids=[0, 1, 0])
    # The loop tabulates every counter a request may reach; the step reads row `counter`.
    assert len(keys) == len(set(keys))
    for (seed, req), r in zip([(5, 0), (5, 1), (6, 0)], out.requests, strict=True):
        used = sorted(c for s, q, c in keys if (s, q) == (seed, req))[: r.forwards]
        assert used == list(range(r.forwards))
    slots = Slots(3)
    layout = [slots.next, *(slots.accept(i) for i in range(3)), *(slots.draft(j) for j in range(3))]
    assert sorted(layout) == list(range(slots.width))  # one decision per slot


@pytest.fixture(scope="module")
def backbone() -> HFBackbone:
    return micro_backbone()


def test_counter_uniforms_are_uniform_and_independent() -> None:
    """KS against U(0, 1) at 1e-3, and lag correlations across slots, counters and requests
    within 5σ of zero (σ = 1/√n)."""
    n = 60_000
    seed = torch.full((n,), 11)
    request, counter = torch.arange(n) % 97, torch.arange(n) // 97
    u = counter_uniforms(seed, request, counter, 9).numpy()
    assert u.min() > 0
    assert u.max() < 1
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-3
    pairs = [(u[:, 0], u[:, 1]), (u[:-97, 4], u[97:, 4]), (u[:-1, 2], u[1:, 2])]
    for a, b in pairs:
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)


def test_counter_uniforms_depend_only_on_the_key() -> None:
    seed, request, counter = (
        torch.tensor([3, 4, 3]),
        torch.tensor([1, 1, 1]),
        torch.tensor([9, 9, 9]),
    )
    u = counter_uniforms(seed, request, counter, 5)
    assert torch.equal(u[0], u[2])
    assert not torch.equal(u[0], u[1])
    alone = counter_uniforms(seed[1:2], request[1:2], counter[1:2], 5)
    assert torch.equal(alone[0], u[1])  # the batch around a row changes nothing
    big = counter_uniforms(torch.tensor([2**40 + 3]), torch.tensor([2**35]), torch.tensor([7]), 3)
    assert bool(((big > 0) & (big < 1)).all())


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 6)], ids=["B", "BM", "BMK"])
def test_inverse_cdf_sampler_matches_the_law_and_never_draws_zero_weight(
    shape: tuple[int, ...],
) -> None:
    """One sampler for every draw: batched over leading dims, frequencies within 5σ of the
    normalized weights, never a zero-weight index, and u → 1 rounding falls back safely."""
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(*shape, generator=g, dtype=torch.float64)
    weights[..., 1] = 0.0
    n = 20_000
    u = torch.rand(n, *shape[:-1], generator=g, dtype=torch.float64)
    draws = sample_inverse_cdf(weights.expand(n, *shape), u)
    assert not bool((draws == 1).any())
    law = (weights / weights.sum(-1, keepdim=True)).reshape(-1, shape[-1])
    flat = draws.reshape(n, -1)
    for row in range(law.shape[0]):
        freq = torch.bincount(flat[:, row], minlength=shape[-1]).double() / n
        sigma = (law[row] * (1 - law[row]) / n).sqrt()
        assert bool(((freq - law[row]).abs() <= 5 * sigma + 1e-12).all())
    edge = sample_inverse_cdf(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([1.0]))
    assert int(edge[0]) == 1
    assert sampling.sample_inverse_cdf is sample_inverse_cdf


def test_concat_is_the_inverse_of_select_and_pads_missing_optional_fields() -> None:
    """State batches split by ``select`` come back whole through ``concat``; a part without an
    optional draft field (a fresh row: ``q`` None) gets zero rows of its own size there."""
    import dataclasses

    from brisk.runtime.isd.batched import Draft, ISDState, StepContext, init_state

    ctx = StepContext(ISDOptions(stride=4, max_new_tokens=8), K=3)
    last, lengths = torch.tensor([2, 3, 6, 7]), torch.tensor([2, 1, 3, 1])
    state = init_state(last, lengths, torch.arange(4), torch.arange(4), ctx)
    q = torch.rand(4, 3, 3)
    state = dataclasses.replace(state, draft=dataclasses.replace(state.draft, q=q))
    parts = [state.select(torch.tensor(r)) for r in ([2], [0, 1], [3])]
    whole = ISDState.concat(parts)
    order = torch.tensor([2, 0, 1, 3])
    for f in dataclasses.fields(ISDState):
        a, b = getattr(whole, f.name), getattr(state.select(order), f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
    fresh = dataclasses.replace(parts[1], draft=dataclasses.replace(parts[1].draft, q=None))
    mixed = Draft.concat([parts[0].draft, fresh.draft, parts[2].draft])
    assert mixed.q.shape == (4, 3, 3)
    assert torch.equal(mixed.q[1:3], torch.zeros(2, 3, 3))
    assert torch.equal(mixed.q[[0, 3]], q[[2, 3]])


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1"])
@pytest.mark.parametrize("chunk", [1, 7, 20], ids=lambda c: f"chunk{c}")
def test_a_chunked_prefill_decodes_as_one_forward_does(
    backbone64: HFBackbone, temperature: float, chunk: int
) -> None:
    """Prompts of 1–12 tokens prefilled in chunks of ``chunk`` tokens per forward (all rows
    together: 1 token means one slot per row per forward) give the tokens, accept lengths and
    counts of the one-forward prefill (float64 micro model: no rounding can flip a decision)."""
    g = torch.Generator().manual_seed(11)
    prompts = [
        torch.randint(0, MASK, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 13, (6,), generator=g)
    ]
    options = ISDOptions(stride=4, temperature=temperature, max_new_tokens=16, eos_token_id=3)
    whole = decode(backbone64, prompts, options, batch_size=6)
    chunked = decode(backbone64, prompts, options, batch_size=6, prefill_chunk=chunk)
    for a, b in zip(whole.requests, chunked.requests, strict=True):
        assert (a.tokens, a.accept_lengths, a.forwards) == (b.tokens, b.accept_lengths, b.forwards)


def test_the_prefill_computes_the_last_prompt_logits_only(
    backbone64: HFBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At V = 151,936 full prefill logits would dwarf the model: every forward of a decode
    computes logits for at most one round's 2M + 1 slots per row, never ``[B, prompt, V]``."""
    shapes: list[tuple[int, ...]] = []
    forward = backbone64.forward

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = forward(*args, **kwargs)
        shapes.append(tuple(out.logits.shape))
        return out

    monkeypatch.setattr(backbone64, "forward", recording)
    prompts = [[1, 2, 4, 5, 6, 7, 8, 9, 10, 1, 2, 4, 5, 6, 7, 8, 9, 10, 1, 2] for _ in range(3)]
    options = ISDOptions(stride=4, max_new_tokens=8)
    decode(backbone64, prompts, options)
    assert shapes[0][:2] == (3, 1)  # the prefill: one row of logits per request
    assert all(s[1] <= 2 * options.M + 1 for s in shapes)


def test_prefill_chunk_must_be_positive(backbone64: HFBackbone) -> None:
    with pytest.raises(ValueError, match="prefill_chunk: must be an integer ≥ 1"):
        decode(backbone64, [[1, 2]], ISDOptions(stride=4, max_new_tokens=4), prefill_chunk=0)


def test_greedy_decoding_without_a_log_hashes_no_uniform(
    backbone: HFBackbone, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy tokens never read a uniform: without a block log (which records them) the hash
    is skipped, and the tokens are those of a run that computes them (a logged one)."""
    calls: list[int] = []
    original = counter_uniforms

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("brisk.runtime.isd.state.counter_uniforms", counting)
    prompts = [[1, 2], [3, 4, 5], [6]]
    greedy = ISDOptions(stride=4, max_new_tokens=12)
    plain = decode(backbone, prompts, greedy)
    assert calls == []
    decode(backbone, prompts, ISDOptions(stride=4, temperature=1.0, max_new_tokens=12))
    assert calls
    from brisk.runtime.isd.batched import StepContext

    assert StepContext(greedy, 4, log=True).needs_uniforms
    assert plain.tokens == [reference_decode(backbone, p, greedy).tokens for p in prompts]
