"""Configs that name a registered thing (a task, a model preset) with its settings, the registry
that holds them, and the worlds that fill it without the runtime importing them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from brisk.runtime.presets import NamedModel, preset_names
from brisk.runtime.tasks.task import NamedTask, checkpoint_task, task_names
from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.pretrain.config import PretrainConfig
from brisk.runtime.train.resume import STATE, start_checkpoint
from brisk.worlds.arithmetic.broad import BroadConfig
from brisk.worlds.arithmetic.model import TinyModelConfig
from brisk.worlds.arithmetic.task import TaskConfig

ROOT = Path(__file__).resolve().parents[2]

# A base run's train_config.json as brisk wrote it before tables were named: the world's and the
# model's settings, no names (configs/paper_base.toml's run, trimmed to what differs).
OLD_SAVED = {
    "out_dir": "runs/paper/base",
    "steps": 1650,
    "eval_problems": 200,
    "threads": 2,
    "max_minutes": 19.5,
    "task": TaskConfig.paper().to_dict(),
    "model": TinyModelConfig(max_positions=256).to_dict(),
}


def test_the_arithmetic_world_is_registered() -> None:
    assert {"arithmetic", "broad"} <= set(task_names())
    assert "tiny" in preset_names()


def test_a_named_table_is_read_by_the_registered_settings_class() -> None:
    task = NamedTask.parse({"name": "arithmetic", "max_operands": 5}, "task.", "")
    assert task == NamedTask("arithmetic", TaskConfig(max_operands=5))
    assert task.max_operands == 5  # the settings' fields read through the name
    with pytest.raises(ValueError, match=r"task\.max_operandz: unknown setting"):
        NamedTask.parse({"name": "arithmetic", "max_operandz": 5}, "task.", "")
    with pytest.raises(ValueError, match=r"task: no task 'gsm9k' \(registered: .*arithmetic"):
        NamedTask.parse({"name": "gsm9k"}, "task.", "")
    with pytest.raises(ValueError, match=r"model\.name: expected the name of a model"):
        NamedModel.parse({"name": 3}, "model.", "tiny")
    with pytest.raises(ValueError, match="model: tiny has no preset 'huge'"):
        NamedModel.named("tiny", "huge")


def test_a_table_without_a_name_names_what_the_field_default_names() -> None:
    base = BaseTrainConfig.from_dict({"task": {"max_operands": 2}, "model": {"layers": 1}})
    assert (base.task.name, base.model.name) == ("arithmetic", "tiny")
    assert base.task.settings == TaskConfig(max_operands=2)
    ar = PretrainConfig.from_dict({"corpus": {"max_chars": 9}})
    assert ar.corpus == NamedTask("broad", BroadConfig(max_chars=9))


def test_a_named_table_is_written_flat_and_read_back() -> None:
    cfg = BaseTrainConfig.paper()
    data = cfg.to_dict()
    assert data["task"] == {"name": "arithmetic", **TaskConfig.paper().to_dict()}
    assert data["model"]["name"] == "tiny"
    assert data["model"]["max_positions"] == 256
    assert BaseTrainConfig.from_dict(json.loads(json.dumps(data))) == cfg


def test_a_config_saved_before_names_loads_and_resumes(tmp_path: Path) -> None:
    """Old checkpoints keep their world (``checkpoint_task``, ``BaseTrainConfig.load``) and an
    interrupted old run resumes; a setting that really changed is still refused."""
    final = tmp_path / "final"
    final.mkdir()
    (final / "train_config.json").write_text(json.dumps(OLD_SAVED))
    assert BaseTrainConfig.load(final / "train_config.json") == BaseTrainConfig.paper()
    assert checkpoint_task(final) == NamedTask("arithmetic", TaskConfig.paper())

    run = tmp_path / "run"
    checkpoint = run / "checkpoint-000010"
    checkpoint.mkdir(parents=True)
    (checkpoint / STATE).write_bytes(b"")
    (checkpoint / "train_config.json").write_text(json.dumps(OLD_SAVED))
    assert start_checkpoint(run, True, BaseTrainConfig.paper()) == checkpoint
    with pytest.raises(ValueError, match=r"another configuration \(steps: 1650 ≠ 1651\)"):
        start_checkpoint(run, True, BaseTrainConfig.paper().replace(steps=1651))


def test_checkpoint_task_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"has no train_config\.json"):
        checkpoint_task(tmp_path)
    (tmp_path / "train_config.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(ValueError, match=r"train_config\.json: task: no \[task\] table"):
        checkpoint_task(tmp_path)
    (tmp_path / "train_config.json").write_text(json.dumps({"task": {"ops": 5}}))
    with pytest.raises(ValueError, match=r"train_config\.json: task\.ops: expected a string"):
        checkpoint_task(tmp_path)


def test_the_runtime_never_imports_the_world_a_lookup_loads_it() -> None:
    """Reading training configs and tasks imports no world; the first registry lookup loads
    it (and still neither torch nor transformers)."""
    probe = (
        "import sys\n"
        "import brisk.runtime.train.base.config, brisk.runtime.tasks.spec, brisk.runtime.presets\n"
        "before = [m for m in sys.modules if m.startswith('brisk.worlds')]\n"
        "from brisk.runtime.tasks import get_task\n"
        "problems = get_task('arithmetic', preset='tiny', n=2, seed=1).problems()\n"
        "print(before, 'brisk.worlds.arithmetic' in sys.modules, len(problems),\n"
        "      [m for m in ('torch', 'transformers') if m in sys.modules])\n"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["[]", "True", "2", "[]"], done.stdout + done.stderr
