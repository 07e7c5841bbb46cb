"""Training end to end on a micro budget: loss falls, the clean stream learns, checkpoints load."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.cli import main
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.prompts import encode_prompt
from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.base.recipe import TrainResult, train_base
from brisk.worlds.arithmetic.task import TaskConfig, make_split


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[BaseTrainConfig, TrainResult]:
    torch.manual_seed(0)
    cfg = BaseTrainConfig.smoke(out_dir=str(tmp_path_factory.mktemp("smoke")))
    return cfg, train_base(cfg, show_progress=False)


def test_loss_falls(trained: tuple[BaseTrainConfig, TrainResult]) -> None:
    _, result = trained
    train = [h for h in result.history if h["event"] == "train"]
    first, last = train[0], train[-1]
    assert last["ce_clean"] < 0.5 * first["ce_clean"]
    assert last["ce_noisy"] < 0.7 * first["ce_noisy"]
    assert (train[0]["stride"], train[-1]["stride"]) == (2, 4)  # the curriculum ran


def answer_log_likelihoods(
    backbone: HFBackbone, tokenizer: Any, problems: list[Any]
) -> list[float]:
    """log p(the sum's digits | "Q: a+b=?\na+b=") under the clean (causal) stream, teacher
    forced, in float64: one number per problem."""
    scores = []
    for problem in problems:
        a, b = problem.operands
        head = encode_prompt(tokenizer, f"{problem.prompt}{a}+{b}=")
        tail = tokenizer.encode(str(problem.answer), add_special_tokens=False)
        with torch.no_grad():
            out = backbone.forward(torch.tensor([head + tail]), backbone.new_cache())
        logp = out.logits[0].double().log_softmax(-1)
        scores.append(sum(float(logp[len(head) - 1 + j, t]) for j, t in enumerate(tail)))
    return scores


def test_clean_stream_beats_chance_on_held_out_sums(
    trained: tuple[BaseTrainConfig, TrainResult],
) -> None:
    """Held-out a+b (one digit each): a guess among the 19 possible sums puts log(1/19) = -2.94
    nats on the right one. The 200-step smoke run puts a mean of -0.98 to -1.77 on it over
    training seeds 0-5 (seed 0: -1.77), so the bound chance + 0.5 keeps a margin of 0.67 nats
    that no change of float summation order crosses (one trajectory's greedy accuracy did: 5
    to 9 of 19 right between an Intel and an AMD CPU). Two controls must fail the same bound:
    a predictor that knows only the law of the sums (-2.96: the bound asks for more than
    the answer's marginal), and the same model untrained (about -7)."""
    _, result = trained
    tokenizer = AutoTokenizer.from_pretrained(result.checkpoint)
    problems = make_split(TaskConfig.trivial(), "test", 19, seed=0)
    bound = math.log(1 / 19) + 0.5
    backbone = HFBackbone.from_pretrained(result.checkpoint)
    scores = answer_log_likelihoods(backbone, tokenizer, problems)
    assert sum(scores) / len(scores) >= bound, scores
    # The bound is above what knowing the sums' law alone scores: P(s) = (10 - |s - 9|) / 100
    # for two uniform digits, whatever the operands (-2.96 on these problems).
    marginal = [math.log((10 - abs(p.answer - 9)) / 100) for p in problems]
    assert sum(marginal) / len(marginal) < bound, marginal
    torch.manual_seed(0)
    untrained = AutoModelForCausalLM.from_config(backbone.model.config).eval()
    control = answer_log_likelihoods(
        HFBackbone(untrained, backbone.mask_token_id), tokenizer, problems
    )
    assert sum(control) / len(control) < bound, control


def test_checkpoint_round_trips(trained: tuple[BaseTrainConfig, TrainResult]) -> None:
    cfg, result = trained
    path = result.checkpoint
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []
    saved = BaseTrainConfig.load(path / "train_config.json")
    assert saved == dataclasses.replace(cfg, lr=3e-3, min_lr=3e-4)  # the rates it ran at
    assert (cfg.lr, cfg.min_lr) == (None, None)  # the defaults from scratch resolved to them
    backbone = HFBackbone.from_pretrained(path)
    assert backbone.mask_token_id == AutoTokenizer.from_pretrained(path).mask_token_id
    lines = (path.parent / "metrics.jsonl").read_text().splitlines()
    events = [json.loads(line)["event"] for line in lines]
    assert (events[0], events[-1]) == ("start", "end")


def test_config_files_and_their_errors(tmp_path: Path) -> None:
    good = tmp_path / "c.toml"
    good.write_text("steps = 7\nstrides = [2, 3]\n[task]\nmax_digits = 1\n[model]\nlayers = 1\n")
    cfg = BaseTrainConfig.load(good)
    assert (cfg.steps, cfg.strides, cfg.task.max_digits, cfg.model.layers) == (7, (2, 3), 1, 1)
    assert [cfg.stride_at(s) for s in range(7)] == [2, 2, 2, 2, 3, 3, 3]
    as_json = tmp_path / "c.json"
    as_json.write_text(json.dumps(cfg.to_dict()))
    assert BaseTrainConfig.load(as_json) == cfg
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nhiden_size = 3\n")
    with pytest.raises(ValueError, match=r"model\.hiden_size: unknown setting"):
        BaseTrainConfig.load(bad)
    with pytest.raises(ValueError, match="strides"):
        BaseTrainConfig(strides=(1,))


def test_the_shipped_config_is_the_tiny_preset() -> None:
    shipped = Path(__file__).parents[2] / "configs" / "tiny_base.toml"
    assert BaseTrainConfig.load(shipped).resolved() == BaseTrainConfig.tiny().resolved()


def test_the_shipped_paper_config_is_the_paper_preset() -> None:
    shipped = Path(__file__).parents[2] / "configs" / "paper_base.toml"
    assert BaseTrainConfig.load(shipped).resolved() == BaseTrainConfig.paper().resolved()


def test_cli_trains_and_evaluates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "smoke.json"
    config.write_text(json.dumps(BaseTrainConfig.smoke(out_dir=str(tmp_path / "run")).to_dict()))
    assert main(["train", "base", "--config", str(config), "--steps", "3", "--no-progress"]) == 0
    figures = tmp_path / "eval.json"
    args = ["--checkpoint", str(tmp_path / "run" / "final"), "--problems", "4", "--strides", "2,3"]
    assert main(["train", "eval", *args, "--json", str(figures)]) == 0
    report = json.loads(figures.read_text())
    assert report["n_problems"] == 4
    assert len(report["proposal_accuracy"]["3"]) == 2
    assert "answer accuracy" in capsys.readouterr().out
    assert main(["train", "base", "--config", str(tmp_path / "missing.toml")]) == 2


def test_an_example_longer_than_the_positions_trains_on_its_first_window(tmp_path: Path) -> None:
    """A model of 24 positions on examples of up to ~40 tokens: each over-long example is cut to
    its first 24 tokens, as brisk train ar cuts them (it stopped the run at the first one); a
    prompt that leaves no response token is one error naming the data."""
    import dataclasses

    cfg = BaseTrainConfig.smoke(str(tmp_path / "cut")).replace(steps=3, batch_size=8)
    short = dataclasses.replace(cfg.model, settings=cfg.model.settings.replace(max_positions=24))
    result = train_base(cfg.replace(model=short), show_progress=False)
    losses = [r["loss"] for r in result.history if r.get("event") == "train"]
    assert losses
    assert all(math.isfinite(x) for x in losses)
    tiny = dataclasses.replace(cfg.model, settings=cfg.model.settings.replace(max_positions=4))
    with pytest.raises(ValueError, match=r"^data: step 0 drew an example whose prompt"):
        train_base(cfg.replace(model=tiny, out_dir=str(tmp_path / "tiny")), show_progress=False)
