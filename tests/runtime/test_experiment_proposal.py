"""The proposal ablation end to end, in miniature: the same code path as
``make reproduce-proposal`` on the micro base, two arms and the base, two seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brisk.runtime.experiment.proposal import ExperimentConfig, run_experiment
from tests.runtime.conftest import micro_experiment_toml


@pytest.mark.slow
def test_micro_ablation_writes_table_plots_and_report(micro_base: Path, tmp_path: Path) -> None:
    arms = ["base", "selfgen-correct-uniform", "selfgen-correct-dynamic"]
    text = micro_experiment_toml(tmp_path / "exp", micro_base, [0, 1], arms, workers=1)
    (tmp_path / "exp.toml").write_text(text)
    cfg = ExperimentConfig.load(tmp_path / "exp.toml")
    summary = run_experiment(cfg, show_progress=False)
    out = tmp_path / "exp"
    assert [a["arm"] for a in summary["arms"]] == list(cfg.arms)
    evals = {(e["arm"], e["seed"]): e for e in summary["evals"]}
    assert set(evals) == {(a, s) for a in cfg.arms for s in (0, 1)}
    # the base arm decodes one checkpoint with each seed's uniforms; trained arms differ
    assert evals[("base", 0)]["forwards"] != evals[("base", 1)]["forwards"] or (
        evals[("base", 0)]["reached"] != evals[("base", 1)]["reached"]
    )
    table = (out / "summary.md").read_text()
    assert "| Self-gen. (corr.) | U |" in table
    assert "| Self-gen. (corr.) | D |" in table
    for name in ("arms.png", "weights_selfgen-correct-dynamic.png", "mechanism/summary.json"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "summary.json").read_text())["best_arm"] == summary["best_arm"]
    # A rerun resumes: every job's evaluation is read back, nothing is trained again.
    again = run_experiment(cfg, show_progress=False)
    assert again["evals"] == summary["evals"]


def test_unknown_arm_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('arms = ["base", "selfgen-magic"]\n')
    with pytest.raises(ValueError, match="arms: unknown arm 'selfgen-magic'"):
        ExperimentConfig.load(tmp_path / "x.toml")
