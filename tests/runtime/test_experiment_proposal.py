"""The proposal ablation end to end, in miniature: the same code path as
``make reproduce-proposal`` on the micro base, two arms and the base, two seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from brisk.experiments.proposal import ExperimentConfig, run_experiment
from brisk.experiments.table import paired_change
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
    # The paper's directions, paired per seed: dynamic against uniform, from the evaluations.
    assert "### The paper's directions" in table
    tpf_run = {(e["arm"], e["seed"]): e["tpf_run"] for e in summary["evals"]}
    change = paired_change(tpf_run, "selfgen-correct-dynamic", "selfgen-correct-uniform")
    assert change is not None
    assert change.k == 2
    logs = [
        math.log(
            evals[("selfgen-correct-dynamic", s)]["tpf_run"]
            / evals[("selfgen-correct-uniform", s)]["tpf_run"]
        )
        for s in (0, 1)
    ]
    assert change.mean == pytest.approx(math.expm1(sum(logs) / 2), rel=1e-12)
    row = next(line for line in table.splitlines() if line.startswith("| dynamic beats uniform"))
    assert f"{100 * change.mean:+.1f} %" in row
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
        config = json.loads(
            (
                tmp_path / "exp" / "arms" / name / "seed0" / "final" / "proposal_config.json"
            ).read_text()
        )
        assert config["token_budget"] == round(epochs * epoch)
    table = (tmp_path / "exp" / "summary.md").read_text()
    assert "| Self-gen. (corr.) | U | 0.5 ep |" in table
    assert "| Base (no continued training) | – | – |" in table
    with pytest.raises(ValueError, match="budgets: need distinct epochs > 0"):
        ExperimentConfig(budgets=(1.0, 1.0))


HEAD_TOML = """
[head.collect]
problems = 30
samples = 3
max_new_tokens = 24
[head.train]
epochs = 10
batch_size = 32
lr = 1e-2
head = "small"
"""


@pytest.mark.slow
def test_head_on_row_is_the_best_arms_backbone_with_a_head(
    micro_base: Path, tmp_path: Path
) -> None:
    """[head]: per seed, the chosen arm's checkpoint collects events, a head is trained on them
    and the backbone is decoded head on with the arms' evaluation: the row ``<arm>+head``."""
    arms = ["base", "selfgen-correct-dynamic"]
    text = micro_experiment_toml(tmp_path / "exp", micro_base, [0, 1], arms, workers=2)
    (tmp_path / "exp.toml").write_text("budgets = [1]\ntheory_samples = 0\n" + text + HEAD_TOML)
    cfg = ExperimentConfig.load(tmp_path / "exp.toml")
    assert cfg.head.enabled
    assert cfg.head.train.head == "small"
    summary = run_experiment(cfg, show_progress=False)
    out = tmp_path / "exp"
    arm = "selfgen-correct-dynamic@1ep"  # the only trained arm: chosen whatever its accuracy
    row = f"{arm}+head"
    assert summary["head"]["arm"] == arm
    assert summary["head"]["row"] == row
    assert [a["arm"] for a in summary["arms"]] == ["base", arm, row]
    evals = {(e["arm"], e["seed"]): e for e in summary["evals"]}
    for seed in (0, 1):
        run = out / "head" / arm / f"seed{seed}"
        saved = json.loads((run / "eval.json").read_text())
        # the frozen backbone is the arm's own seed-s checkpoint, and the head decoded
        assert saved["backbone"] == str(out / "arms" / arm / f"seed{seed}" / "final")
        assert (run / "final" / "config.json").is_file()
        assert (run / "events" / "_events.json").is_file()
        assert saved["train"]["steps"] > 0
        head_ev, own = evals[(row, seed)], evals[(arm, seed)]
        assert head_ev["head_s"] > 0
        assert own["head_s"] == 0
        # the arms' evaluation: same problems and decode seeds, other drafts
        assert head_ev["problems"] == own["problems"]
        assert (head_ev["accepted"], head_ev["forwards"]) != (own["accepted"], own["forwards"])
        assert (run / "blocks").is_dir()
    table = (out / "summary.md").read_text()
    assert "| Self-gen. (corr.) + corrector head | D | 1 ep |" in table
    assert f"Head-on row {row}" in table
    assert f"| {row} |" in table
    # A rerun resumes: the head-on jobs are read back, nothing collected or trained again.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "head").rglob("*") if p.is_file()}
    again = run_experiment(cfg, show_progress=False)
    assert again["evals"] == summary["evals"]
    assert again["head"] == summary["head"]
    assert {p: p.stat().st_mtime_ns for p in (out / "head").rglob("*") if p.is_file()} == stamps


def test_head_section_is_off_unless_given_and_its_keys_are_checked(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('arms = ["base", "selfgen-correct-dynamic"]\n')
    assert not ExperimentConfig.load(tmp_path / "a.toml").head.enabled
    (tmp_path / "b.toml").write_text('arms = ["base", "selfgen-correct-dynamic"]\n[head]\n')
    cfg = ExperimentConfig.load(tmp_path / "b.toml")
    assert cfg.head.enabled
    assert cfg.head.collect.problems == 2000
    for body, key in (
        ("[head]\ncolect = 1\n", "head.colect"),
        ("[head.train]\nepoch = 3\n", "head.train.epoch"),
        ("[head.collect]\nsample = 3\n", "head.collect.sample"),
    ):
        (tmp_path / "c.toml").write_text(body)
        with pytest.raises(ValueError, match=rf"{key}: unknown setting") as err:
            ExperimentConfig.load(tmp_path / "c.toml")
        assert "\n" not in str(err.value)
    (tmp_path / "d.toml").write_text('arms = ["base"]\n[head]\n')
    with pytest.raises(ValueError, match="head: the head-on row needs a trained arm"):
        ExperimentConfig.load(tmp_path / "d.toml")
    (tmp_path / "e.toml").write_text("[head.collect]\ntop_k = 8\n")
    with pytest.raises(ValueError, match=r"head\.collect\.top_k: 8 < train\.K = 16"):
        ExperimentConfig.load(tmp_path / "e.toml")


def test_best_arm_keeps_the_base_accuracy_then_maximizes_tpf() -> None:
    from brisk.experiments.evaluate import ArmSummary
    from brisk.experiments.headon import choose_arm
    from brisk.mechanism.stats import Interval

    def arm(name: str, acc: list[float], tpf: float) -> ArmSummary:
        return ArmSummary(
            name, (0, 1, 2), {"accuracy": Interval.of(acc), "tpf_run": Interval.of([tpf] * 3)}
        )

    rows = {
        "base": arm("base", [0.80, 0.80, 0.80], 2.0),
        "fast@5ep": arm("fast@5ep", [0.60, 0.61, 0.59], 4.0),  # faster, far less accurate
        "good@5ep": arm("good@5ep", [0.79, 0.785, 0.79], 3.0),  # within 2 points
        "ok@5ep": arm("ok@5ep", [0.80, 0.80, 0.80], 2.5),
        "good@1ep": arm("good@1ep", [0.80, 0.80, 0.80], 9.0),  # not the largest budget
    }
    names = list(rows)
    assert choose_arm(names, rows, [5, 1])[0] == "good@5ep"
    # noisy seeds widen the tolerance: a 5-point drop inside the interval qualifies
    rows["fast@5ep"] = arm("fast@5ep", [0.65, 0.85, 0.75], 4.0)
    assert choose_arm(names, rows, [5, 1])[0] == "fast@5ep"
    # none within the tolerance: the most accurate; no base arm: the fastest
    worse = {n: arm(n, [0.5, 0.5, 0.5], t) for n, t in (("a", 3.0), ("b", 4.0))}
    worse["a"] = arm("a", [0.6, 0.6, 0.6], 3.0)
    assert choose_arm(["base", "a", "b"], {**worse, "base": rows["base"]}, [])[0] == "a"
    assert choose_arm(["a", "b"], worse, [])[0] == "b"
    assert choose_arm(["base"], {"base": rows["base"]}, [])[0] is None
