"""The report of a synthetic log: its numbers, table, notes and plots, and its edges."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from brisk.cli import main
from brisk.mechanism import BlockLogWriter, analyze, synthetic_blocks
from brisk.mechanism.plots import plot_positions, plot_repetition
from brisk.mechanism.render import markdown, table_rows
from brisk.mechanism.summary import NO_CORRECTOR


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "log"
    with BlockLogWriter(path, 7, 16) as writer:
        for batch in synthetic_blocks(5000, seed=9):
            writer.write(batch)
    return path


def test_synthetic_log_looks_like_a_server(log: Path) -> None:
    s = analyze(log, draws=100)
    assert s.n_requests == 50
    assert s.replay.contradictions == 0  # accept_len follows the same-state rule
    a = s.profile.rates()
    assert np.all(np.diff(a) < 0.02)  # the profile declines along the block
    assert 0.2 < s.replay.rescue.equal_request < 0.7
    assert 0.0 < s.replay.regression.equal_request < 0.05
    cov = s.coverage.coverage.equal_request
    assert np.all(np.diff(cov) >= 0)
    assert 0.6 < cov[3] < cov[7] < cov[15] < 1
    rep = s.repetition
    assert rep.adjacent_first_breakers.equal_request > rep.adjacent_verified.equal_request
    assert rep.adjacent_per_block_head.equal_request < rep.adjacent_per_block_base.equal_request
    assert s.likelihood.mean_delta.equal_request > 0
    assert s.tpf.low <= s.tpf.estimate <= s.tpf.high
    assert "excl." in markdown(s)  # some requests have no non-adjacent-repeat breakers


def test_progress_and_seed(log: Path) -> None:
    seen: list[int] = []
    a = analyze(log, draws=50, seed=3, batch_rows=1000, progress=seen.append)
    assert seen == [1000] * 5
    b = analyze(log, draws=50, seed=3)
    assert a.to_dict() == b.to_dict()
    c = analyze(log, draws=50, seed=4)
    assert c.replay.rescue.low != a.replay.rescue.low
    assert c.replay.rescue.equal_request == a.replay.rescue.equal_request


def test_cli_rejects_bad_k_and_bootstrap(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mechanism", "report", str(log), "--out", str(tmp_path), "--k", "4,17"]) == 2
    assert "--k: need values in 1..K = 16" in capsys.readouterr().err
    assert main(["mechanism", "report", str(log), "--out", str(tmp_path), "--bootstrap", "-1"]) == 2
    assert "--bootstrap" in capsys.readouterr().err


def test_cli_synth_then_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mechanism", "synth", str(tmp_path / "s"), "--blocks", "300", "--K", "8"]) == 0
    assert main(["mechanism", "validate", str(tmp_path / "s")]) == 0
    assert "ok, 300 blocks" in capsys.readouterr().out


def test_degenerate_log_reports_without_crashing(tmp_path: Path) -> None:
    """Every block accepted and no log-probabilities: empty populations are reported as such
    (null in JSON, '—' in the table), not as zeros."""
    cols = next(synthetic_blocks(40, 3, 4, seed=1, logp=False))
    cols["accept_len"] = np.full(40, 3, dtype=np.int16)
    cols["p"] = np.nan_to_num(cols["p"], nan=0.5)
    cols["verifier_top1"] = np.where(cols["verifier_top1"] < 0, 7, cols["verifier_top1"])
    cols["verifier_top1_prob"] = np.nan_to_num(cols["verifier_top1_prob"], nan=0.5)
    with BlockLogWriter(tmp_path / "log", 3, 4) as writer:
        writer.write(cols)
    out = tmp_path / "report"
    assert main(["mechanism", "report", str(tmp_path / "log"), "--out", str(out), "--k", "2"]) == 0
    saved = json.loads((out / "summary.json").read_text())
    assert saved["replay"]["first_breakers"] == 0
    assert saved["replay"]["rescue"]["equal_request"] is None
    assert saved["likelihood"]["pairs"] == 0
    assert saved["acceptance_profile"]["rates"] == [1.0, 1.0, 1.0]
    md = (out / "summary.md").read_text()
    assert "| Corrector rescues rejection | Per 100 first breakers | — | — | 0 (" in md
    # the head ran but nothing was scored: ΔL says why instead of showing dashes
    assert "| Mean ΔL | Nats per 3-token block | no block scored by both base_logp and " in md
    assert NO_CORRECTOR not in md
    # no first breakers: panels (a) and (b) say so, (c) draws the accepted positions
    a, b, c = _axes_texts(plot_positions(analyze(tmp_path / "log", draws=0)))
    assert a == b == ["no first breakers where the head ran"]
    assert c == []


def _axes_texts(fig: Figure) -> list[list[str]]:
    """The text written inside each axes of a figure (then closes it)."""
    import matplotlib.pyplot as plt

    texts = [[t.get_text() for t in ax.texts] for ax in fig.axes]
    plt.close(fig)
    return texts


def head_off_columns(n: int = 300, M: int = 3, K: int = 4) -> dict[str, np.ndarray]:
    """A synthetic log as a head-off server writes it: no head choices, no head blocks, and
    only the base block scored."""
    cols = next(synthetic_blocks(n, M, K, seed=2))
    cols["head_choice"] = np.full((n, M), -1, dtype=np.int16)
    cols["head_block"] = np.full((n, M), -1, dtype=np.int16)
    cols["head_logp"] = np.full(n, np.nan)
    return cols


HEAD_ROWS = frozenset(
    {
        "Corrector changes selected token",
        "Corrector rescues rejection",
        "Corrector introduces rejection",
        "Mean ΔL",
        "Refined block has higher likelihood",
        "Equal recorded likelihood",
        "Base block has higher likelihood",
        "Head rescues adjacent-repeat breaker",
        "Head rescues non-adjacent-repeat breaker",
        "Adjacent repeats, base block",
        "Adjacent repeats, head block",
        "Non-adjacent repeats, base block",
        "Non-adjacent repeats, head block",
    }
)


def test_head_off_log_says_no_corrector(tmp_path: Path) -> None:
    """Without a corrector, the head's rows and panels say so; the base's are unchanged."""
    with BlockLogWriter(tmp_path / "log", 3, 4) as writer:
        writer.write(head_off_columns())
    out = tmp_path / "report"
    assert main(["mechanism", "report", str(tmp_path / "log"), "--out", str(out)]) == 0
    s = analyze(tmp_path / "log", draws=20)
    assert not s.has_corrector
    assert json.loads((out / "summary.json").read_text())["corrector"] is False
    md = (out / "summary.md").read_text()
    assert f"**Note:** {NO_CORRECTOR}" in md
    rows = table_rows(s)
    head_rows = [row for row in rows if row.quantity in HEAD_ROWS]
    assert len(head_rows) == len(HEAD_ROWS)
    for row in head_rows:
        assert (row.value, row.pooled, row.requests) == (NO_CORRECTOR, "", "")
        assert f"| {row.quantity} | {row.unit} | {NO_CORRECTOR} |  |  |" in md
    assert md.count(NO_CORRECTOR) == len(HEAD_ROWS) + 1  # the rows and the note
    # the rows that read only the base keep their numbers
    for row in rows:
        if row.quantity not in HEAD_ROWS:
            assert row.value[0].isdigit(), row
    assert _axes_texts(plot_positions(s)) == [[NO_CORRECTOR]] * 3
    prevalence, per_block = _axes_texts(plot_repetition(s))
    assert NO_CORRECTOR not in prevalence
    assert per_block == [NO_CORRECTOR]


def test_head_with_choices_only_names_what_is_missing(tmp_path: Path) -> None:
    """A head that made per-position choices but drafted no block: only the whole-block rows
    lack data, and they name the missing column rather than the corrector."""
    cols = head_off_columns()
    cols["head_choice"] = cols["base_choice"]
    with BlockLogWriter(tmp_path / "log", 3, 4) as writer:
        writer.write(cols)
    s = analyze(tmp_path / "log", draws=0)
    assert s.has_corrector
    assert s.head_gap("head_choice") is None
    assert s.head_gap("head_block") == "no head blocks (head_block = −1 throughout)"
    assert _axes_texts(plot_repetition(s))[1] == [s.head_gap("head_block")]
    rescue = next(r for r in table_rows(s) if r.quantity == "Corrector rescues rejection")
    assert rescue.pooled == "0.00"  # the head equals the base: it never rescues
