"""One of two torchrun ranks SIGKILLed mid-run (as the OOM killer ends a process), in each
recipe that trains under torchrun (base, proposal, drafter): the job ends within a bounded
time, the surviving rank says so in one line naming itself (it was a 30-line gloo traceback),
and ``--resume`` ends where an uninterrupted two-rank run ends, bit for bit, with no step logged
twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.runtime.conftest import proposal_args, tiny_base_toml, torchrun

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
CONFIG = tiny_base_toml(steps=24, batch_size=8, save_every=4)
ENDS_WITHIN_S = 60.0


def steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    # a training step's record (proposal's records carry no "event" key)
    return [
        r["step"]
        for r in map(json.loads, lines)
        if r.get("event", "train") == "train" and "loss" in r
    ]


def rank_pids(recipe: str, out: Path) -> list[int]:
    """The two rank processes of the run writing to ``out`` (torchrun's children)."""
    found = subprocess.run(
        ["pgrep", "-f", f"brisk.cli train {recipe} .*{out}"], capture_output=True, text=True
    )
    ranks = []
    for pid in (int(p) for p in found.stdout.split()):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"torch.distributed.run" not in cmdline:
            ranks.append(pid)
    return sorted(ranks)


def recipe_args(
    recipe: str, tmp_path: Path, micro_base: Path, micro_dataset: Path
) -> tuple[Callable[[Path], list[str]], str]:
    """The recipe's command for an output directory (long enough to be killed mid-run, a
    checkpoint every few steps) and the checkpoint after which a rank is killed."""
    if recipe == "base":
        config = tmp_path / "base.toml"
        config.write_text(CONFIG)
        args = ["train", "base", "--config", str(config), "--no-progress"]
        return lambda out: [*args, "--out", str(out)], "checkpoint-000008"
    if recipe == "proposal":
        extra = ("--token-budget", "6000", "--save-every", "4")
        return lambda out: proposal_args(micro_base, micro_dataset, out, *extra), (
            "checkpoint-000008"
        )
    settings = {
        "--target": micro_base,
        "--dataset": micro_dataset,
        "--block-size": 4,
        "--target-layer-ids": 0,
        "--token-budget": 4000,
        "--batch-size": 8,
        "--anchors": 8,
        "--eval-problems": 0,
        "--log-every": 1,
        "--save-every": 4,
        "--threads": 1,
    }
    flags = [str(x) for pair in settings.items() for x in pair]
    return lambda out: ["train", "drafter", *flags, "--no-progress", "--out", str(out)], (
        "checkpoint-000008"
    )


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


@pytest.mark.parametrize("recipe", ["base", "proposal", "drafter"])
def test_a_killed_rank_ends_the_job_in_one_line_and_resume_finishes_it(
    recipe: str, tmp_path: Path, micro_base: Path, micro_dataset: Path
) -> None:
    command, after = recipe_args(recipe, tmp_path, micro_base, micro_dataset)
    whole = tmp_path / "whole"
    done = subprocess.run(torchrun(2, command(whole)), env=ENV, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    out = tmp_path / "killed"
    job = subprocess.Popen(
        torchrun(2, command(out)),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / after).is_dir():  # two checkpoints, then mid-run
            assert job.poll() is None, job.communicate()[1][-2000:]
            assert time.monotonic() < deadline, f"no {after}"
            time.sleep(0.05)
        ranks = rank_pids(recipe, out)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = job.communicate(timeout=ENDS_WITHIN_S + 30)
        ended = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    assert ended < ENDS_WITHIN_S, f"the job took {ended:.0f} s to end"
    said = [line for line in err.splitlines() if "another rank's process is gone" in line]
    assert len(said) == 1, err[-3000:]
    assert said[0].startswith("brisk: error: rank 0 of 2: ")
    assert "[rank0]: Traceback" not in err  # the survivor's own output is the one line

    resumed = subprocess.run(
        torchrun(2, [*command(out), "--resume"]), env=ENV, capture_output=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(steps(whole)) > 8
    assert steps(out) == steps(whole)
    assert len(set(steps(out))) == len(steps(out))  # no step logged twice
    a, b = final_weights(whole), final_weights(out)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
