"""One of two torchrun ranks SIGKILLed mid-run (as the OOM killer ends a process): the job ends
within a bounded time, the surviving rank says so in one line naming itself (it was a 30-line
gloo traceback), and ``--resume`` ends where an uninterrupted two-rank run ends, bit for bit,
with no step logged twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.runtime.conftest import tiny_base_toml, torchrun

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
CONFIG = tiny_base_toml(steps=24, batch_size=8, save_every=4)
ENDS_WITHIN_S = 60.0


def steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "train"]


def rank_pids(out: Path) -> list[int]:
    """The two rank processes of the run writing to ``out`` (torchrun's children)."""
    found = subprocess.run(
        ["pgrep", "-f", f"brisk.cli train base .*--out {out}"], capture_output=True, text=True
    )
    pids = [int(p) for p in found.stdout.split()]
    ranks = []
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"torch.distributed.run" not in cmdline:
            ranks.append(pid)
    return sorted(ranks)


def test_a_killed_rank_ends_the_job_in_one_line_and_resume_finishes_it(tmp_path: Path) -> None:
    config = tmp_path / "base.toml"
    config.write_text(CONFIG)
    args = ["train", "base", "--config", str(config), "--no-progress"]
    whole = tmp_path / "whole"
    done = subprocess.run(
        torchrun(2, [*args, "--out", str(whole)]), env=ENV, capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]

    out = tmp_path / "killed"
    job = subprocess.Popen(
        torchrun(2, [*args, "--out", str(out)]),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-000008").is_dir():  # two checkpoints, then mid-run
            assert job.poll() is None, job.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no second checkpoint"
            time.sleep(0.1)
        ranks = rank_pids(out)
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
        torchrun(2, [*args, "--out", str(out), "--resume"]),
        env=ENV,
        capture_output=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert steps(out) == steps(whole) == list(range(24))
    a = load_file(whole / "final" / "model.safetensors")
    b = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
