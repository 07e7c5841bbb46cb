"""The tensor side of the chain verify (:mod:`brisk.runtime.serving.chain`) against definitions:
rows read back from :class:`PoolStates` are exactly the rows written (``ISDState.concat`` of
them, optional fields zero-filled) and a row is stale once SGLang hands its pool row out again;
the custom mask equals the per-request construction written out row by row; the batched verify
attention equals softmax attention written per request and per slot, in float64."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from brisk.runtime.isd.batched import ISDState, StepContext, init_state
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.serving.chain import PoolStates, chain_attention, chain_layout, verify_mask

M, K = 3, 4
CTX = StepContext(ISDOptions(stride=M + 1, top_k=K), K)


def random_rows(B: int, seed: int, stepped: bool) -> ISDState:
    """B rows whose every field differs (a cold start's when not ``stepped``; a step's, with
    the logs' q and the head's other block, when it is)."""
    g = torch.Generator().manual_seed(seed)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(1, 1000, shape, generator=g)

    state = init_state(ints(B), ints(B), ints(B), ints(B), CTX, counter=ints(B))
    if not stepped:
        return state
    draft = dataclasses.replace(
        state.draft,
        tokens=ints(B, M),
        ranks=ints(B, M),
        cand_ids=ints(B, M, K),
        law=torch.rand(B, M, K, generator=g),
        anchor=ints(B),
        offset=ints(B),
        q=torch.rand(B, M, K, generator=g),
        alt_tokens=ints(B, M),
        head_drafted=True,
    )
    return dataclasses.replace(
        state, verify=torch.rand(B, generator=g) < 0.5, block_index=ints(B), draft=draft
    )


def assert_rows_equal(want: Any, got: Any, where: str = "state") -> None:
    for f in dataclasses.fields(want):
        a, b = getattr(want, f.name), getattr(got, f.name)
        name = f"{where}.{f.name}"
        if dataclasses.is_dataclass(a):
            assert_rows_equal(a, b, name)
        elif isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor), f"{name}: missing"
            torch.testing.assert_close(
                b, a, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}"
            )
        else:
            assert a == b, f"{name}: {a!r} != {b!r}"


def test_rows_read_back_as_written_whatever_the_order() -> None:
    table = PoolStates(9, CTX, "cpu")
    cold, stepped = random_rows(3, 0, stepped=False), random_rows(4, 1, stepped=True)
    table.write(torch.tensor([7, 2, 4, 1]), stepped)
    table.write(torch.tensor([5, 1, 3]), cold)  # row 1: a stepped row replaced by a cold one
    got = table.read(torch.tensor([2, 1, 3, 7, 5]))
    # what concat gives the same rows: the cold rows' q and other block zero-filled
    want = ISDState.concat(
        [
            stepped.select(torch.tensor([1])),
            cold.select(torch.tensor([1, 2])),
            stepped.select(torch.tensor([0])),
            cold.select(torch.tensor([0])),
        ]
    )
    assert_rows_equal(want, got)


def test_every_field_has_its_own_storage() -> None:
    """A write to one field never shows in another (the table's fields are distinct tensors)."""
    table = PoolStates(4, CTX, "cpu")
    rows = random_rows(1, 2, stepped=False)
    table.write(torch.tensor([2]), rows)
    assert_rows_equal(rows, table.read(torch.tensor([2])))
    fields = [
        table.table.seed,
        table.table.request,
        table.table.counter,
        table.table.pending,
        table.table.length,
        table.table.block_index,
    ]
    assert len({t.data_ptr() for t in fields}) == len(fields)


def test_a_row_is_stale_once_its_pool_row_is_handed_out_again() -> None:
    """SGLang bumps a pool row's generation on every allocation (``req_generation``)."""
    table = PoolStates(6, CTX, "cpu")
    generation = torch.zeros(6, dtype=torch.long)
    index = torch.tensor([4, 1])
    generation[index] += 1  # the prefill's allocation
    assert table.missing(index, generation).tolist() == [True, True]
    table.write(index, random_rows(2, 3, stepped=False))
    table.claim(index, generation)
    assert table.missing(index, generation).tolist() == [False, False]
    generation[1] += 1  # row 1's request finished and another took the pool row
    assert table.missing(index, generation).tolist() == [False, True]
    table.clear()  # SGLang flushed its cache
    assert table.missing(index, generation).tolist() == [True, True]


def mask_by_rows(seq_lens: list[int], n: int) -> torch.Tensor:
    """Per request: n rows ``[ones(seq_len) | row i of the n × n lower triangle]``."""
    chain = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.cat(
        [torch.cat([torch.ones(n, s, dtype=torch.bool), chain], 1).flatten() for s in seq_lens]
    )


@pytest.mark.parametrize(
    ("seq_lens", "n"),
    [
        pytest.param([5], 7, id="B1-n7"),
        pytest.param([0, 3, 1], 3, id="B3-n3-empty-prefix"),
        pytest.param([17, 2, 9, 30, 1, 4, 11, 6], 15, id="B8-n15"),
        pytest.param([2, 2], 1, id="B2-n1"),
    ],
)
def test_verify_mask_is_the_prefix_and_the_chain_per_request(seq_lens: list[int], n: int) -> None:
    lens = torch.tensor(seq_lens)
    got = verify_mask(lens, lens.clone(), n)
    torch.testing.assert_close(got, mask_by_rows(seq_lens, n), rtol=0, atol=0)


def attention_by_slot(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    seq_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """Slot i of request b: softmax(q·kᵀ · scale) v over positions 0 .. seq_len_b + i, each
    query head on its group's KV head, in float64."""
    B, Hq, Hkv = len(seq_lens), q.shape[1], k_cache.shape[1]
    n = q.shape[0] // B
    out = torch.empty(q.shape, dtype=torch.float64)
    for b, s in enumerate(seq_lens):
        for i in range(n):
            at = slots[b, : s + i + 1].long()
            for h in range(Hq):
                k = k_cache[at, h * Hkv // Hq].double()  # [s + i + 1, D]
                v = v_cache[at, h * Hkv // Hq].double()
                w = torch.softmax(k @ q[b * n + i, h].double() * scale, dim=0)
                out[b * n + i, h] = w @ v
    return out


@pytest.mark.parametrize(
    ("seq_lens", "n", "heads"),
    [
        pytest.param([5], 7, (4, 2), id="B1-n7-gqa"),
        pytest.param([0, 3, 1], 3, (2, 2), id="B3-n3-empty-prefix"),
        pytest.param([17, 2, 9, 30, 1, 4, 11, 6], 15, (4, 2), id="B8-n15-gqa"),
        pytest.param([2, 40], 1, (4, 1), id="B2-n1-mqa"),
    ],
)
def test_chain_attention_is_each_slot_over_its_prefix_and_chain(
    seq_lens: list[int], n: int, heads: tuple[int, int]
) -> None:
    """The pool's unused rows hold NaN: padding that read them unmasked would show."""
    Hq, Hkv = heads
    D, pool = 8, 512
    g = torch.Generator().manual_seed(len(seq_lens) * 100 + n)
    k_cache = torch.full((pool, Hkv, D), float("nan"))
    v_cache = torch.full((pool, Hkv, D), float("nan"))
    width = max(seq_lens) + n
    slots = torch.zeros(len(seq_lens), width + 3, dtype=torch.int32)  # wider, as req_to_token
    free = torch.randperm(pool - 1, generator=g) + 1
    taken = 0
    for b, s in enumerate(seq_lens):
        at = free[taken : taken + s + n]
        taken += s + n
        slots[b, : s + n] = at.int()
        k_cache[at] = torch.randn(s + n, Hkv, D, generator=g)
        v_cache[at] = torch.randn(s + n, Hkv, D, generator=g)
    q = torch.randn(len(seq_lens) * n, Hq, D, generator=g)
    layout = chain_layout(slots, torch.tensor(seq_lens), n, width)
    got = chain_attention(q, k_cache, v_cache, layout, scale=0.3)
    want = attention_by_slot(q, k_cache, v_cache, slots, seq_lens, scale=0.3)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
