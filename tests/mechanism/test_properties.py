"""Property tests: rates are rates, a head that copies the base changes nothing, and no statistic
depends on how requests are ordered or how the log is split into files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from brisk.mechanism import BlockBatch, BlockLogWriter, block_table, summarize
from brisk.mechanism.reference import reference_tally
from brisk.mechanism.schema import UNKNOWN_VERIFICATION, Verification
from brisk.mechanism.stats import Mean, Rate, RateArray
from brisk.mechanism.tally import RequestTally, tally_batches, tally_blocks
from tests.mechanism.logs import random_columns, random_logs

VERIFICATIONS = [
    UNKNOWN_VERIFICATION,
    Verification("greedy", "argmax", 1.0),
    Verification("greedy", "head", 1.0),
    Verification("sampled", "q", 1.0),
    Verification("sampled", "q_topk", 0.7),
    Verification("sampled", "head", 1.0),
]


def _tally(
    cols: dict[str, Any], M: int, K: int, verification: Verification = UNKNOWN_VERIFICATION
) -> RequestTally:
    tally = tally_batches([BlockBatch.from_columns(cols, M, K, verification=verification)])
    assert tally is not None
    return tally


def _rates(obj: Any) -> list[Rate | RateArray]:
    found: list[Rate | RateArray] = []
    for value in obj.__dict__.values():
        if isinstance(value, Rate | RateArray):
            found.append(value)
        elif hasattr(value, "__dataclass_fields__") and not isinstance(value, Mean):
            found.extend(_rates(value))
    return found


@given(random_logs())
@settings(max_examples=100)
def test_every_rate_lies_in_unit_interval(log: tuple[dict[str, Any], int, int]) -> None:
    cols, M, K = log
    s = summarize(_tally(cols, M, K), ks=(K,), draws=10)
    rates = _rates(s)
    assert len(rates) == 7 + 3 + 3 + 6  # replay, coverage, likelihood, repetition
    for r in rates:
        for field in ("equal_request", "pooled", "low", "high"):
            x = np.atleast_1d(getattr(r, field))
            x = x[np.isfinite(x)]
            assert np.all((x >= 0) & (x <= 1)), (field, r)
        assert np.all(np.atleast_1d(r.requests + r.excluded) == s.n_requests)


@given(random_logs(head_is_base=True))
@settings(max_examples=100)
def test_head_equal_to_base_changes_nothing(log: tuple[dict[str, Any], int, int]) -> None:
    cols, M, K = log
    s = summarize(_tally(cols, M, K), ks=(K,), draws=0)
    for r in (
        s.replay.rescue,
        s.replay.regression,
        s.replay.intervention,
        s.replay.intervention_accepted,
    ):
        assert r.numerator == 0
        assert r.equal_request in (0.0,) or np.isnan(r.equal_request)
    for arr in (
        s.replay.rescue_by_position,
        s.replay.regression_by_position,
        s.replay.intervention_by_position,
    ):
        assert not arr.numerator.any()
    assert s.likelihood.positive.numerator == s.likelihood.negative.numerator == 0
    rep = s.repetition
    assert repr(rep.adjacent_per_block_base) == repr(rep.adjacent_per_block_head)
    assert repr(rep.nonadjacent_per_block_base) == repr(rep.nonadjacent_per_block_head)


@given(random_logs(), st.sampled_from(VERIFICATIONS))
@settings(max_examples=150)
def test_vectorized_tally_equals_per_row_reference(
    log: tuple[dict[str, Any], int, int], verification: Verification
) -> None:
    """Under every verification rule (which changes the replay and the consistency check)."""
    cols, M, K = log
    batch = BlockBatch.from_columns(cols, M, K, verification=verification)
    assert _tally(cols, M, K, verification).equals(reference_tally([batch]))


@given(random_logs(), st.integers(0, 2**32 - 1), st.integers(1, 4))
@settings(max_examples=60)
def test_permuting_and_splitting_change_no_statistic(
    log: tuple[dict[str, Any], int, int], seed: int, parts: int
) -> None:
    cols, M, K = log
    n = len(cols["request_id"])
    rng = np.random.default_rng(seed)
    whole = summarize(_tally(cols, M, K), ks=(K,), draws=30).__dict__
    # shuffle whole requests (and rows within them), then cut anywhere into batches
    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), min(parts - 1, n - 1), replace=False))
    batches = [
        BlockBatch.from_columns({k: v[idx] for k, v in cols.items()}, M, K)
        for idx in np.split(order, cuts)
    ]
    tally = tally_batches(batches)
    assert tally is not None
    assert tally.equals(_tally(cols, M, K))
    split = summarize(tally, ks=(K,), draws=30).__dict__
    for key in ("replay", "coverage", "likelihood", "repetition", "tpf"):
        assert repr(split[key]) == repr(whole[key]), key


def test_splitting_into_files_and_directories(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    cols = random_columns(rng, 300, 6, 7, 4)
    pq.write_table(block_table(cols, 7, 4), tmp_path / "one.parquet")
    order = rng.permutation(300)
    for j, idx in enumerate(np.array_split(order, 3)):
        pq.write_table(
            block_table({k: v[idx] for k, v in cols.items()}, 7, 4), tmp_path / f"part{j}.parquet"
        )
    with BlockLogWriter(tmp_path / "dir", 7, 4, rows_per_group=64) as w:
        w.write({k: v[order] for k, v in cols.items()})
    one = tally_blocks(tmp_path / "one.parquet", batch_rows=50)
    three = tally_blocks([tmp_path / f"part{j}.parquet" for j in (2, 0, 1)])
    directory = tally_blocks(tmp_path / "dir")
    assert one.equals(three)
    assert one.equals(directory)
    a = summarize(one, draws=200, ks=(4,)).to_dict()
    b = summarize(directory, draws=200, ks=(4,)).to_dict()
    assert a == b
