"""The training harness with a recipe of its own (the one ``docs/training.md`` shows): a recipe
that fills in its batches, loss and record gets the run directory's rules, one log schema, the
stop on a signal and a resume to the same bits, as the five ``brisk train`` recipes do."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from brisk._interrupt import Interrupted
from brisk.runtime.configs import Config
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train


@dataclass(frozen=True)
class LineConfig(Config):
    out_dir: str = "line"
    steps: int = 30
    lr: float = 0.2
    seed: int = 0
    log_every: int = 4
    save_every: int = 8


class LineRecipe(Recipe[LineConfig, float]):
    """Fit y = 3x − 1 on fresh draws from the recipe's own generator; ``stop_at`` sends the
    process SIGINT during that step, as Ctrl-C would."""

    label = "line"

    def __init__(self, cfg: LineConfig, stop_at: int | None = None) -> None:
        super().__init__(cfg)
        self.stop_at = stop_at

    def build(self, run: Run) -> None:
        self.model = torch.nn.Linear(1, 1)  # drawn after the harness seeds torch with cfg.seed
        if run.start is not None:
            self.model.load_state_dict(load_file(run.start / "line.safetensors"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.cfg.lr)
        self.draws = torch.Generator().manual_seed(self.cfg.seed)

    def state_dict(self) -> dict[str, Any]:
        return {"draws": self.draws.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.draws.set_state(state["draws"])

    def step(self, run: Run, step: int) -> StepRecord:
        if step == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)
        x = torch.randn(16, 1, generator=self.draws)
        noise = 0.1 * torch.randn(16, 1)  # the global RNG: restored on resume
        loss = torch.nn.functional.mse_loss(self.model(x), 3 * x - 1 + noise)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return StepRecord({"loss": loss.item()})

    def write(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        save_file(weights or self.model.state_dict(), directory / "line.safetensors")
        (directory / self.config_file).write_text(json.dumps(self.cfg.to_dict()))

    def finish(self, run: Run, final: Path) -> float:
        return self.model.weight.item()


def timeless(result: TrainResult[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in result.history]


def test_a_stopped_recipe_resumes_to_the_bits_of_an_uninterrupted_run(tmp_path: Path) -> None:
    whole = train(LineRecipe(LineConfig(out_dir=str(tmp_path / "whole"))), show_progress=False)
    cfg = LineConfig(out_dir=str(tmp_path / "part"))
    with pytest.raises(Interrupted, match=r"at step 12/30; saved .*checkpoint-000012"):
        train(LineRecipe(cfg, stop_at=11), show_progress=False)
    assert sorted(p.name for p in (tmp_path / "part").glob("checkpoint-*")) == [
        "checkpoint-000008",
        "checkpoint-000012",
    ]
    resumed = train(LineRecipe(cfg), show_progress=False)
    a = load_file(whole.checkpoint / "line.safetensors")
    b = load_file(resumed.checkpoint / "line.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert timeless(resumed)[1:] == timeless(whole)[1:]  # all but the start's out_dir
    assert resumed.steps == whole.steps == 30
    # Negative control: another seed is another run, so the comparison can fail.
    other = train(LineRecipe(cfg.replace(out_dir=str(tmp_path / "o"), seed=1)), show_progress=False)
    assert not torch.equal(load_file(other.checkpoint / "line.safetensors")["weight"], a["weight"])


def test_every_record_has_an_event_and_train_records_count_steps_taken(tmp_path: Path) -> None:
    result = train(LineRecipe(LineConfig(out_dir=str(tmp_path / "r"))), show_progress=False)
    logged = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").open()]
    assert logged == result.history
    assert [r["event"] for r in logged] == ["start"] + ["train"] * 9 + ["end"]
    assert [r["step"] for r in logged if r["event"] == "train"] == [1, 4, 8, 12, 16, 20, 24, 28, 30]
    assert logged[0]["params"] == 2
    assert logged[0]["config"]["steps"] == 30
    assert abs(result.outcome - 3) < 0.1
    assert not (tmp_path / "r" / "final" / "trainer_state.pt").exists()  # never resumed


def test_the_run_directory_rules_hold_for_any_recipe(tmp_path: Path) -> None:
    cfg = LineConfig(out_dir=str(tmp_path / "r"))
    train(LineRecipe(cfg), show_progress=False)
    with pytest.raises(ValueError, match="holds a finished run"):
        train(LineRecipe(cfg), show_progress=False)
    with pytest.raises(Interrupted):
        train(LineRecipe(cfg.replace(out_dir=str(tmp_path / "s")), stop_at=9), show_progress=False)
    with pytest.raises(ValueError, match="already holds a run"):
        train(LineRecipe(cfg.replace(out_dir=str(tmp_path / "s"))), False, resume=False)
    with pytest.raises(ValueError, match=r"another configuration \(lr: 0.2 ≠ 0.1\)"):
        train(LineRecipe(cfg.replace(out_dir=str(tmp_path / "s"), lr=0.1)), False)
