"""The worker's request-state lifecycle on its pool-indexed rows, without a server: a request
that reaches decode with no row of its own cold-starts (from its last token, its counter past
every forward it can have run), a request with one keeps it, and a pool row SGLang handed to a
new request is never read as the old request's.

The worker is built bare (``object.__new__``) with the attributes ``_states`` reads: the rows,
SGLang's request pool (its per-row generation) and the step's context."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from brisk.runtime.isd.batched import ISDState, StepContext, init_state
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.serving.chain import PoolStates
from brisk.runtime.serving.common import request_key
from brisk.runtime.serving.options import BriskISDOptions
from brisk.runtime.serving.worker import BriskISDWorker
from tests.serving.test_chain import assert_rows_equal, random_rows

M, K, ROWS = 3, 4, 8
CTX = StepContext(ISDOptions(stride=M + 1, top_k=K), K)


def bare_worker() -> Any:
    worker = object.__new__(BriskISDWorker)
    worker.options = BriskISDOptions(stride=M + 1, seed=5)
    worker.ctx, worker.device = CTX, torch.device("cpu")
    worker.rows = PoolStates(ROWS, CTX, "cpu")
    worker.req_to_token_pool = SimpleNamespace(req_generation=torch.zeros(ROWS, dtype=torch.long))
    return worker


def request(rid: str, prompt: list[int], output: list[int], seed: int | None = None) -> Any:
    params = SimpleNamespace(sampling_seed=seed)
    return SimpleNamespace(
        rid=rid, origin_input_ids=prompt, output_ids=output, sampling_params=params
    )


def decode_batch(reqs: list[Any], index: list[int]) -> Any:
    pool = torch.tensor(index)
    return SimpleNamespace(reqs=reqs, req_pool_indices=pool, req_pool_indices_cpu=pool.clone())


def test_a_request_without_a_row_cold_starts_and_one_with_a_row_keeps_it() -> None:
    worker = bare_worker()
    generation = worker.req_to_token_pool.req_generation
    generation[[2, 6]] += 1  # SGLang hands out pool rows 2 and 6
    prefilled = random_rows(1, 7, stepped=True)
    worker.rows.write(torch.tensor([6]), prefilled)  # row 6 was prefilled here
    worker.rows.claim(torch.tensor([6]), generation)
    fresh = request("fresh", [9, 8, 7], [4, 5], seed=11)
    batch = decode_batch([fresh, request("kept", [1], [2])], [2, 6])
    got = worker._states(batch)
    # the fresh request: a cold start from its last token, counter = its length
    length = torch.tensor([5])
    want = init_state(
        torch.tensor([5]),
        length,
        torch.tensor([11]),
        torch.tensor([request_key("fresh")]),
        CTX,
        counter=length,
    )
    # the batch is the two rows as concat gives them (the logs' fields zero-filled)
    assert_rows_equal(ISDState.concat([want, prefilled]), got)
    # read again: the cold row is now the request's own
    assert_rows_equal(got, worker._states(batch))


def test_a_pool_row_handed_to_another_request_is_not_read_as_the_old_one() -> None:
    worker = bare_worker()
    generation = worker.req_to_token_pool.req_generation
    generation[3] += 1
    old = random_rows(1, 8, stepped=True)
    worker.rows.write(torch.tensor([3]), old)
    worker.rows.claim(torch.tensor([3]), generation)
    generation[3] += 1  # the request finished; a new one (no prefill here) took row 3
    new = request("new", [3, 1, 4], [], seed=None)  # no seed: the server's (options.seed)
    got = worker._states(decode_batch([new], [3]))
    length = torch.tensor([3])
    want = init_state(
        torch.tensor([4]),
        length,
        torch.tensor([5]),
        torch.tensor([request_key("new")]),
        CTX,
        counter=length,
    )
    assert_rows_equal(ISDState.concat([want, old]).select(torch.tensor([0])), got)
