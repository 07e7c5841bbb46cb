"""A log small enough to work out by hand (M = 3, K = 3, q = (0.5, 0.3, 0.2) everywhere).

Request 1 has four blocks, request 2 one, so equal-request and pooled rates differ:

- A (L = 1): position 2 is the first breaker; base p/q = 0.1/0.5 → α = 0.2 < u = 0.5 (J = 0),
  the head's rank 1 has p/q = 0.6/0.3 → J = 1: a **rescue** (and an intervention). Its base
  token at position 2 repeats position 1's token (adjacent repeat at the first breaker).
- B (L = 2): at accepted position 1 the head's rank 1 has α = 0.05/0.3 < u = 0.5 while the
  base is accepted: a **regression**. Position 3 breaks, the head keeps the base token.
- C (L = 3, twice): every position accepted, head = base.
- D (request 2, L = 0): position 1 breaks (α = 0.1), the head's rank 2 has α = 1: a rescue.

Whole-block ΔL: A +1, B −1, C 0, C 0, D +0.5.

The log is head-on (``head_block`` = ``head_choice``). ``data/v1_handbuilt.parquet`` holds the
same blocks as the version 1 writer wrote them (no token_offset, head_block or page checksums).
A second, shadow-mode log (:func:`shadow_blocks`) has a head block different from the head's
per-position choices.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogWriter, analyze, block_table, read_blocks, validate
from brisk.mechanism.reference import reference_rates, reference_tally
from brisk.mechanism.summary import MechanismSummary
from brisk.mechanism.tally import tally_blocks
from tests.mechanism.logs import NAN, as_version_1, hand_block, stack

V1_LOG = Path(__file__).parent / "data" / "v1_handbuilt.parquet"

ACCEPT = [0.6, 0.2, 0.1]
UNREACHED = [NAN, NAN, NAN]


def blocks() -> list[dict[str, object]]:
    cand_a = [[10, 11, 12], [10, 21, 22], [30, 31, 32]]  # position 2's base token repeats 10
    A = hand_block(
        1,
        0,
        1,
        [ACCEPT, [0.1, 0.6, 0.2], UNREACHED],
        [0.5, 0.5, 0.5],
        base=[0, 0, 0],
        head=[0, 1, 2],
        cand=cand_a,
        logp=(-5.0, -4.0),
    )
    B = hand_block(
        1,
        1,
        2,
        [[0.6, 0.05, 0.1], [0.7, 0.1, 0.1], [0.1, 0.1, 0.5]],
        [0.5, 0.3, 0.9],
        base=[0, 0, 0],
        head=[1, 0, 0],
        logp=(-5.0, -6.0),
    )
    C = hand_block(
        1, 2, 3, [ACCEPT] * 3, [0.5] * 3, base=[0, 0, 0], head=[0, 0, 0], logp=(-3.0, -3.0)
    )
    C2 = {**C, "block_index": 3}
    D = hand_block(
        2,
        0,
        0,
        [[0.05, 0.5, 0.3], UNREACHED, UNREACHED],
        [0.5, 0.5, 0.5],
        base=[0, 0, 0],
        head=[2, 0, 0],
        top1=[999, -1, -1],
        top1_prob=[0.55, NAN, NAN],
        logp=(-2.0, -1.5),
    )
    return [A, B, C, C2, D]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hand") / "log"
    with BlockLogWriter(path, M=3, K=3) as writer:
        for b in blocks():
            writer.write_block(**b)
    return path


@pytest.fixture(scope="module")
def summary(log: Path) -> MechanismSummary:
    return analyze(log, ks=(1, 2, 3), draws=50)


def test_first_breakers_rescue_regression_intervention(summary: MechanismSummary) -> None:
    r = summary.replay
    assert r.first_breakers == 3
    assert r.first_breakers_by_position.tolist() == [1, 1, 1]
    assert r.contradictions == 0
    # rescue: request 1 → 1 of 2, request 2 → 1 of 1
    assert (r.rescue.equal_request, r.rescue.pooled) == (0.75, 2 / 3)
    assert (r.rescue.numerator, r.rescue.denominator, r.rescue.requests) == (2, 3, 2)
    assert (r.intervention.equal_request, r.intervention.pooled) == (0.75, 2 / 3)
    # regression: request 1 → 1 of 9 accepted positions; request 2 has none and is excluded
    assert (r.regression.equal_request, r.regression.pooled) == (1 / 9, 1 / 9)
    assert (r.regression.requests, r.regression.excluded) == (1, 1)
    assert r.intervention_accepted.equal_request == 1 / 9
    assert r.rescue_by_position.equal_request.tolist() == [1.0, 1.0, 0.0]
    assert r.rescue_by_position.excluded.tolist() == [1, 1, 1]
    assert r.regression_by_position.numerator.tolist() == [1, 0, 0]
    assert r.regression_by_position.denominator.tolist() == [4, 3, 2]


def test_coverage_and_mass(summary: MechanismSummary) -> None:
    c = summary.coverage
    # top-1 ranks at the first breakers: A → 1, B → 2, D → outside C
    assert c.coverage.equal_request.tolist() == [0.0, 0.25, 0.5]
    assert c.coverage.pooled.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3], abs=0)
    # mass weights by p*: A 0.6, B 0.5, D 0.55 (stored as float32)
    assert c.mass.equal_request.tolist() == pytest.approx([0.0, 3 / 11, 0.5], abs=1e-7)
    assert c.mass.pooled.tolist() == pytest.approx([0.0, 0.6 / 1.65, 1.1 / 1.65], abs=1e-7)
    # verifier mass on C_{K'}: A (0.1, 0.7, 0.9), B (0.1, 0.2, 0.7), D (0.05, 0.55, 0.85)
    expected = [(0.1 + 0.1) / 4 + 0.05 / 2, (0.7 + 0.2) / 4 + 0.55 / 2, (0.9 + 0.7) / 4 + 0.85 / 2]
    assert c.set_mass.equal_request.tolist() == pytest.approx(expected, abs=1e-7)


def test_whole_block_likelihood(summary: MechanismSummary) -> None:
    lk = summary.likelihood
    assert lk.pairs == 5
    assert (lk.mean_delta.equal_request, lk.mean_delta.pooled) == (0.25, 0.1)
    assert (lk.positive.equal_request, lk.positive.pooled) == (0.625, 0.4)
    assert (lk.tied.equal_request, lk.tied.pooled) == (0.25, 0.4)
    assert (lk.negative.equal_request, lk.negative.pooled) == (0.125, 0.2)


def test_repetition(summary: MechanismSummary) -> None:
    rep = summary.repetition
    # verified positions: request 1 has 2 + 3 + 3 + 3 = 11 with one adjacent repeat, request 2 one
    assert (rep.adjacent_verified.equal_request, rep.adjacent_verified.pooled) == (1 / 22, 1 / 12)
    assert (rep.adjacent_first_breakers.equal_request, rep.adjacent_first_breakers.pooled) == (
        0.25,
        1 / 3,
    )
    assert rep.nonadjacent_verified.numerator == 0
    assert (rep.adjacent_head_rescue.equal_request, rep.adjacent_head_rescue.excluded) == (1.0, 1)
    assert rep.nonadjacent_head_rescue.requests == 0
    assert (rep.adjacent_per_block_base.equal_request, rep.adjacent_per_block_base.pooled) == (
        0.125,
        0.2,
    )
    assert rep.adjacent_per_block_head.equal_request == 0.0


def test_acceptance_profile(summary: MechanismSummary) -> None:
    assert summary.profile.reached.tolist() == [5, 4, 3]
    assert summary.profile.accepted.tolist() == [4, 3, 2]
    assert summary.n_blocks == 5
    assert summary.n_requests == 2


def test_reference_agrees_exactly(log: Path, summary: MechanismSummary) -> None:
    fast = tally_blocks(log)
    slow = reference_tally(log)
    assert fast.equals(slow)
    ref = reference_rates(slow)
    assert ref["rescue"] == (summary.replay.rescue.equal_request, summary.replay.rescue.pooled)
    assert ref["regression"] == (
        summary.replay.regression.equal_request,
        summary.replay.regression.pooled,
    )


def test_intervals_bracket_estimates(summary: MechanismSummary) -> None:
    r = summary.replay.rescue
    assert r.low <= r.equal_request <= r.high


def test_cli_report(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert (
        main(
            ["mechanism", "report", str(log), "--out", str(out), "--k", "2,3", "--bootstrap", "20"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Corrector rescues rejection" in printed
    assert "75.00" in printed  # equal-request rescue, per 100 first breakers
    assert "66.67" in printed  # pooled beside it
    for name in (
        "summary.json",
        "summary.md",
        "positions.png",
        "repetition.png",
        "coverage.png",
        "acceptance_profile.png",
    ):
        assert (out / name).stat().st_size > 0
    md = (out / "summary.md").read_text()
    assert "| Corrector rescues rejection | Per 100 first breakers | 75.00" in md
    saved = json.loads((out / "summary.json").read_text())
    assert saved["replay"]["rescue"]["pooled"] == pytest.approx(2 / 3, abs=0)
    assert saved["replay"]["rescue"]["equal_request"] == 0.75


def test_version_1_log_reads_as_written(log: Path, summary: MechanismSummary) -> None:
    """The v1 writer's file (no checksums, no v2 columns) validates and gives every statistic
    of the same blocks written as v2; token_offset reads as −1 and head_block as head_choice."""
    assert pq.ParquetFile(V1_LOG).schema_arrow.metadata[b"brisk.version"] == b"1"
    assert validate(V1_LOG, M=3, K=3) == 5
    (batch,) = read_blocks(V1_LOG)
    assert batch["token_offset"].tolist() == [-1] * 5
    np.testing.assert_array_equal(batch["head_block"], batch["head_choice"])
    old = analyze(V1_LOG, ks=(1, 2, 3), draws=50).to_dict()
    new = summary.to_dict()
    assert old.pop("files") == [str(V1_LOG)]
    new.pop("files")
    assert old == new
    assert tally_blocks(V1_LOG).equals(tally_blocks(log))


def shadow_blocks() -> list[dict[str, object]]:
    """Shadow mode, one request (M = 3, K = 3, anchor 1). With C_1 = (5, 6, 7),
    C_2 = (6, 5, 8), C_3 = (6, 9, 5) and base ranks (0, 0, 0) the base block is 5 6 6 (one
    adjacent repeat). The head's per-position choices (1, 1, 1) on the base's prefix read
    6 5 9 (no repeat); its own blocks differ:

    - S1 (L = 1): own block (1, 0, 0) = 6 6 6, two adjacent repeats. Position 2 breaks; the
      head's per-position rank 1 (p/q = 0.6/0.3) rescues it, its own block's rank 0 would not.
    - S2 (L = 3): own block (1, 2, 0) = 6 8 6, one non-adjacent repeat.
    - S3 (L = 3): the head chose per position (0, 0, 0) but drafted no block (−1).
    """
    cand = [[5, 6, 7], [6, 5, 8], [6, 9, 5]]
    common = {"base": [0, 0, 0], "head": [1, 1, 1], "cand": cand, "anchor": 1}
    S1 = hand_block(
        1, 0, 1, [ACCEPT, [0.1, 0.6, 0.2], UNREACHED], [0.5] * 3, head_block=[1, 0, 0], **common
    )
    S2 = hand_block(1, 1, 3, [ACCEPT] * 3, [0.5] * 3, head_block=[1, 2, 0], **common)
    S3 = hand_block(
        1, 2, 3, [ACCEPT] * 3, [0.5] * 3, **(common | {"head": [0, 0, 0]}), head_block=[-1] * 3
    )
    return [S1, S2, S3]


def test_whole_block_repeats_read_the_heads_own_block(tmp_path: Path) -> None:
    cols = stack(shadow_blocks())
    with BlockLogWriter(tmp_path / "shadow", M=3, K=3) as writer:
        writer.write(cols)
    rep = analyze(tmp_path / "shadow", draws=0).repetition
    assert rep.paired_blocks == 2  # S3 has no head block
    assert rep.adjacent_per_block_base.equal_request == 1.0
    assert rep.nonadjacent_per_block_base.equal_request == 0.0
    assert rep.adjacent_per_block_head.equal_request == 1.0  # (2 + 0) / 2, from head_block
    assert rep.nonadjacent_per_block_head.equal_request == 0.5  # (0 + 1) / 2
    # the per-position, same-state diagnostics read head_choice: S1's breaker is rescued
    replay = analyze(tmp_path / "shadow", draws=0).replay
    assert (replay.rescue.numerator, replay.rescue.denominator) == (1, 1)
    assert (replay.intervention.numerator, replay.intervention.denominator) == (1, 1)
    # read as version 1 (head_block := head_choice), the head's tokens would be 6 5 9, 6 5 9
    # and 5 6 6: no repeat in S1 and S2, and S3 joins the paired blocks
    pq.write_table(as_version_1(block_table(cols, 3, 3)), tmp_path / "as_v1.parquet")
    v1 = analyze(tmp_path / "as_v1.parquet", draws=0).repetition
    assert v1.paired_blocks == 3
    assert v1.adjacent_per_block_head.equal_request == 1 / 3
    assert v1.nonadjacent_per_block_head.equal_request == 0.0
