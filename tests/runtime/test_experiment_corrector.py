"""The corrector ablation end to end, in miniature: the same code path as
``make reproduce-corrector`` on the micro base, head off and two heads, two seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brisk.experiments.corrector import CorrectorExperimentConfig, run_corrector_experiment


@pytest.mark.slow
def test_micro_corrector_ablation_writes_tables_plots_and_report(
    micro_base: Path, tmp_path: Path
) -> None:
    text = f"""
out_dir = "{tmp_path / "exp"}"
backbone = "{micro_base}"
stride = 4
seeds = [0, 1]
arms = ["off", "distilled", "no-prefix"]
workers = 1
[collect]
problems = 30
samples = 3
max_new_tokens = 24
[train]
epochs = 2
batch_size = 64
head = "small"
[eval]
problems = 12
max_new_tokens = 24
batch_size = 12
"""
    (tmp_path / "exp.toml").write_text(text)
    cfg = CorrectorExperimentConfig.load(tmp_path / "exp.toml")
    summary = run_corrector_experiment(cfg, show_progress=False)
    out = tmp_path / "exp"
    assert [a["arm"] for a in summary["arms"]] == list(cfg.arms)
    runs = {(r["arm"], r["seed"]): r for r in summary["runs"]}
    assert set(runs) == {(a, s) for a in cfg.arms for s in (0, 1)}
    assert runs[("off", 0)]["eval"]["head_s"] == 0
    assert runs[("distilled", 0)]["eval"]["head_s"] > 0
    assert set(summary["mechanism"]) == {"distilled", "no-prefix"}  # shadow logs of trained heads
    table = (out / "summary.md").read_text()
    assert "| No corrector (head off) |" in table
    assert "| Without prefix feedback |" in table
    assert "Rescue / 100 first breakers" in table
    for name in ("arms.png", "rescue.png", "val_loss.png", "mechanism/summary.json"):
        assert (out / name).stat().st_size > 0
    # the no-prefix head really hides x_{j−1}
    cfg_file = out / "arms" / "no-prefix" / "seed0" / "final" / "config.json"
    assert json.loads(cfg_file.read_text())["prefix_feedback"] is False
    again = run_corrector_experiment(cfg, show_progress=False)  # resumes: nothing retrained
    assert again["runs"] == summary["runs"]


def test_an_arm_needing_more_candidates_than_collected_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('arms = ["k32"]\n[collect]\ntop_k = 16\n')
    with pytest.raises(ValueError, match=r"collect\.top_k: 16 < K = 32 of arm 'k32'"):
        CorrectorExperimentConfig.load(tmp_path / "x.toml")
    (tmp_path / "y.toml").write_text('arms = ["off", "magic"]\n')
    with pytest.raises(ValueError, match="arms: unknown arm 'magic'"):
        CorrectorExperimentConfig.load(tmp_path / "y.toml")
