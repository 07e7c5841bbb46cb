"""The proposal ablation end to end, in miniature: the same code path as
``make reproduce-proposal`` on the micro base, two arms and the base, two seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from brisk.runtime.experiment.proposal import ExperimentConfig, run_experiment
from brisk.theory import progress_weights, tpf
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
    # theory next to the measurement: the weights at each arm's own pooled profile
    assert "### Theory at each arm's measured profile" in table
    assert [r["arm"] for r in summary["theory"]] == list(cfg.arms)
    for row in summary["theory"]:
        a = np.clip(row["a"], 1e-6, 1 - 1e-6)
        np.testing.assert_allclose(row["brisk"], progress_weights(a), rtol=1e-12)
        assert row["tpf_profile"] == pytest.approx(float(tpf(row["a"])), rel=1e-12)
        assert len(row["ce_mask"]) == len(row["beta"]) == 3
    # A rerun resumes: every job's evaluation is read back, nothing is trained again.
    again = run_experiment(cfg, show_progress=False)
    assert again["evals"] == summary["evals"]


def test_unknown_arm_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.toml").write_text('arms = ["base", "selfgen-magic"]\n')
    with pytest.raises(ValueError, match="arms: unknown arm 'selfgen-magic'"):
        ExperimentConfig.load(tmp_path / "x.toml")


@pytest.mark.slow
def test_budgets_are_epochs_of_the_correct_responses(micro_base: Path, tmp_path: Path) -> None:
    """budgets = [0.5, 1]: each arm trains for that many epochs of the base's correct
    self-generated tokens (the same for every arm), one table row per arm and budget."""
    arms = ["base", "selfgen-correct-uniform"]
    text = micro_experiment_toml(tmp_path / "exp", micro_base, [0], arms, workers=1)
    (tmp_path / "exp.toml").write_text("budgets = [0.5, 1]\ntheory_samples = 0\n" + text)
    cfg = ExperimentConfig.load(tmp_path / "exp.toml")
    summary = run_experiment(cfg, show_progress=False)
    epoch = summary["tokens_per_epoch"]
    assert epoch > 0
    names = [a["arm"] for a in summary["arms"]]
    assert names == ["base", "selfgen-correct-uniform@0.5ep", "selfgen-correct-uniform@1ep"]
    for name, epochs in (
        ("selfgen-correct-uniform@0.5ep", 0.5),
        ("selfgen-correct-uniform@1ep", 1),
    ):
        config = json.loads((tmp_path / "exp" / "arms" / name / "seed0" / "final"
                             / "proposal_config.json").read_text())  # fmt: skip
        assert config["token_budget"] == round(epochs * epoch)
    table = (tmp_path / "exp" / "summary.md").read_text()
    assert "| Self-gen. (corr.) | U | 0.5 ep |" in table
    assert "| Base (no continued training) | – | – |" in table
    with pytest.raises(ValueError, match="budgets: need distinct epochs > 0"):
        ExperimentConfig(budgets=(1.0, 1.0))
