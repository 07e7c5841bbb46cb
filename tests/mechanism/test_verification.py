"""A log says how it was verified, and the report's replay and consistency check follow it.

The hand-built blocks of :mod:`tests.mechanism.test_handbuilt` are consistent with greedy
verification (accepted positions hold the verifier's top-1, first breakers do not) and with
sampled verification under q (u·q < p exactly at the accepted positions). Under the paper's
rule they are consistent too; a greedy log the paper's rule would flag is built below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from brisk.cli import main
from brisk.mechanism import BlockLogError, BlockLogWriter, analyze
from brisk.mechanism.render import notes
from brisk.mechanism.schema import Verification
from tests.mechanism.logs import hand_block
from tests.mechanism.test_handbuilt import blocks

GREEDY = Verification("greedy", "argmax", 1.0)


def write(path: Path, rows: list[dict[str, object]], verification: Verification | None) -> Path:
    with BlockLogWriter(path, M=3, K=3, verification=verification) as writer:
        for b in rows:
            writer.write_block(**b)
    return path


def greedy_but_not_paper() -> list[dict[str, object]]:
    """Accepted tokens that are the verifier's argmax but fail u < p/q (u = 0.9, p/q = 0.8):
    what a greedily verified log looks like to the paper's sampled rule."""
    p = [[0.4, 0.3, 0.2]] * 3
    return [hand_block(1, k, 3, p, [0.9] * 3, base=[0, 0, 0], head=[0, 0, 0]) for k in range(3)]


def test_a_consistent_greedy_log_has_no_note(tmp_path: Path) -> None:
    s = analyze(write(tmp_path / "log", greedy_but_not_paper(), GREEDY), draws=20)
    assert s.verification == GREEDY
    assert s.replay.contradictions == 0
    assert not [n for n in notes(s) if "contradicts" in n]


def test_the_same_blocks_without_a_record_are_flagged(tmp_path: Path) -> None:
    """Without the verification recorded, the paper's rule contradicts every accepted
    position (3 blocks × 3), and the note says the log does not record its rule."""
    s = analyze(write(tmp_path / "log", greedy_but_not_paper(), None), draws=20)
    assert s.replay.contradictions == 9
    assert any("does not record how it was verified" in n for n in notes(s))


def test_a_real_contradiction_in_a_greedy_log_is_noted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = greedy_but_not_paper()
    rows[1] = {**rows[1], "verifier_top1": np.array([10, 999, 30])}  # accepted, yet not top-1
    log = write(tmp_path / "log", rows, GREEDY)
    assert analyze(log, draws=20).replay.contradictions == 1
    assert main(["mechanism", "report", str(log), "--out", str(tmp_path / "r")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "at 1 reached positions the log's own verification rule (greedy" in printed
    assert "contradicts accept_len" in printed


def test_greedy_replay_uses_the_argmax(tmp_path: Path) -> None:
    """Greedy same-state rule J(x) = 1[x = top-1]: A's head takes the top-1 at the breaker (a
    rescue), B's head leaves the top-1 at an accepted position (a regression), and D's head
    takes rank 2, not the verifier's favourite outside C (no rescue, unlike the paper's rule)."""
    s = analyze(write(tmp_path / "log", blocks(), GREEDY), ks=(3,), draws=20)
    r = s.replay
    assert r.contradictions == 0
    assert (r.rescue.numerator, r.rescue.denominator) == (1, 3)
    assert (r.regression.numerator, r.regression.denominator) == (1, 9)
    paper = analyze(write(tmp_path / "paper", blocks(), None), ks=(3,), draws=20).replay
    assert (paper.rescue.numerator, paper.rescue.denominator) == (2, 3)


@pytest.mark.parametrize("law", ["q", "q_topk"])
def test_sampled_logs_are_checked_against_their_draft_law(tmp_path: Path, law: str) -> None:
    s = analyze(write(tmp_path / "log", blocks(), Verification("sampled", law, 1.0)), draws=20)  # type: ignore[arg-type]
    assert s.replay.contradictions == 0
    assert s.replay.unchecked_blocks == 0


def test_q_topk_renormalizes_over_the_candidates(tmp_path: Path) -> None:
    """q over C sums to 0.5: π = 2q. u·π(x) = 0.9·0.8 = 0.72 ≥ p = 0.5 rejects the accepted token,
    which u·q = 0.36 < 0.5 would have accepted: a q_topk log that says L = 1 is contradicted."""
    row = hand_block(
        1,
        0,
        1,
        [[0.5, 0.2, 0.1], [0.1, 0.2, 0.1], [np.nan] * 3],
        [0.9, 0.5, 0.5],
        base=[0, 0, 0],
        head=[-1, -1, -1],
        q=(0.4, 0.05, 0.05),
    )
    topk = analyze(write(tmp_path / "topk", [row], Verification("sampled", "q_topk", 1.0)), draws=5)
    full = analyze(write(tmp_path / "full", [row], Verification("sampled", "q", 1.0)), draws=5)
    assert (topk.replay.contradictions, full.replay.contradictions) == (1, 0)


def test_head_drafted_sampled_logs_cannot_be_checked(tmp_path: Path) -> None:
    log = write(tmp_path / "log", blocks(), Verification("sampled", "head", 1.0))
    s = analyze(log, draws=20)
    assert s.replay.unchecked_blocks == 5
    assert any("was not checked" in n for n in notes(s))


def test_a_report_refuses_logs_verified_differently(tmp_path: Path) -> None:
    a = write(tmp_path / "a", blocks()[:2], GREEDY)
    b = write(tmp_path / "b", blocks()[2:], Verification("sampled", "q_topk", 1.0))
    with pytest.raises(BlockLogError, match="report them separately") as err:
        analyze([a, b], draws=5)
    assert str(b) in str(err.value)


def test_verification_is_validated() -> None:
    with pytest.raises(ValueError, match="draft_law"):
        Verification("greedy", "q", 1.0)
    with pytest.raises(ValueError, match="temperature"):
        Verification("sampled", "q", 0.0)
    with pytest.raises(ValueError, match="rule"):
        Verification("beam", "q", 1.0)  # type: ignore[arg-type]
