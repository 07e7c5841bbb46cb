"""``brisk train ar`` on a user's own corpus (a folder of Python files, ``[corpus.corpus] root``),
as the code world's docs describe it: with no held-out file (``heldout_fraction = 0``) the run
trains, saves and ends with exit 0, saying once that there is no held-out loss to log; the task
is named for what it reads (``python``), ``stdlib`` staying the interpreter's library."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from brisk.cli import main

MODULE = '''\
def area(width, height):
    """The area of a width × height rectangle."""
    return width * height


def scaled(values, factor=2):
    """Every value times ``factor``."""
    return [v * factor for v in values]
'''

CONFIG = """\
out_dir = "{out}"
steps = 3
batch_size = 4
lr = 3e-3
min_lr = 3e-4
warmup_steps = 1
log_every = 1
save_every = 0
final_eval_problems = 0
threads = 1

[corpus]
name = "{name}"
max_chars = 400

[corpus.corpus]
root = "{root}"
heldout_fraction = {fraction}

[model]
name = "code"
hidden_size = 32
layers = 1
heads = 2
kv_heads = 1
intermediate_size = 64
max_positions = 256
vocab_size = 300

[model.corpus]
root = "{root}"
heldout_fraction = {fraction}
"""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "mypkg"
    root.mkdir()
    for i in range(6):
        body = MODULE.replace("area", f"area{i}").replace("scaled", f"scaled{i}")
        (root / f"mod{i}.py").write_text(textwrap.dedent(body))
    return root


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BRISK_CACHE", str(tmp_path / "cache"))  # never the user's cache


@pytest.mark.usefixtures("cache")
def test_a_corpus_with_no_held_out_file_trains_and_ends_well(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "ar.toml"
    out = tmp_path / "run"
    config.write_text(CONFIG.format(out=out, name="python", root=corpus, fraction=0.0))
    assert main(["train", "ar", "--config", str(config), "--no-progress"]) == 0
    assert (out / "final" / "config.json").is_file()
    events = [
        json.loads(line)["event"] for line in (out / "metrics.jsonl").read_text().splitlines()
    ]
    assert "heldout" not in events
    assert events[-1] == "end"
    assert "no held-out document" in capsys.readouterr().err


@pytest.mark.usefixtures("cache")
def test_a_held_out_corpus_logs_its_loss_under_the_python_name(
    corpus: Path, tmp_path: Path
) -> None:
    config = tmp_path / "ar.toml"
    out = tmp_path / "run"
    config.write_text(CONFIG.format(out=out, name="python", root=corpus, fraction=0.5))
    assert main(["train", "ar", "--config", str(config), "--no-progress"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    heldout = [r for r in records if r["event"] == "heldout"]
    assert len(heldout) == 1
    assert heldout[0]["tokens"] > 0
