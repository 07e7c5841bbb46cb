"""``brisk train drafter`` under torchrun (gloo on this CPU), on the micro target and its own
regenerated responses: two DDP ranks (two micro-batches each) and two FSDP ranks take the steps
one process takes at the same global batch and save the plain DFlash drafter; an FSDP run cut
back to its first checkpoint and resumed under torchrun ends where the uninterrupted one ends;
``--fsdp`` without torchrun is one line naming it, exit 2.

The weighting is ``brisk``, whose weights need the step's acceptance counts of the whole global
batch before any backward: the DDP ranks count them with a forward without gradients first
(several micro-batches), the FSDP ranks all-reduce them between their forward and backward.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from brisk.cli import main
from brisk.runtime.drafter import load_drafter
from tests.runtime.conftest import torchrun

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
if torch.cuda.device_count() < 2:  # two ranks take a GPU each; with fewer, both use the CPU
    ENV["CUDA_VISIBLE_DEVICES"] = ""


def argv(target: Path, dataset: Path, out: Path, *extra: str) -> list[str]:
    """5 steps of a global batch of 8 responses (800 drafted targets at about 180 a step), a
    checkpoint every 2 steps, no evaluation, one thread (the ranks: ``OMP_NUM_THREADS=1``)."""
    settings = {
        "--target": target,
        "--dataset": dataset,
        "--out": out,
        "--block-size": 4,
        "--target-layer-ids": 0,
        "--token-budget": 800,
        "--batch-size": 8,
        "--anchors": 8,
        "--eval-problems": 0,
        "--log-every": 1,
        "--save-every": 2,
        "--threads": 1,
    }
    flags = [str(x) for pair in settings.items() for x in pair]
    return ["train", "drafter", *flags, "--no-progress", *extra]


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def steps(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "train"]


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def one(micro_base: Path, micro_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process run (in this process: a few seconds), which the ranks must match."""
    out = tmp_path_factory.mktemp("drafter_one") / "one"
    with torch.random.fork_rng():
        assert main(argv(micro_base, micro_dataset, out)) == 0
    return out


def assert_same_steps(one: Path, two: Path) -> None:
    """Every step: the drafted targets exactly (the same global batch and anchors), the loss,
    the per-position CE, the BRISK weights and the tracked acceptance rates to rtol 1e-5 (the
    same argmax matches, counted on two ranks); the final drafter to atol 1e-5 (the same sums
    in another order), saved as the plain DFlash checkpoint in fp32."""
    x_steps, y_steps = steps(one), steps(two)
    assert len(x_steps) == len(y_steps) == 5
    for x, y in zip(x_steps, y_steps, strict=True):
        assert (x["step"], x["tokens"]) == (y["step"], y["tokens"])
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
        for key in ("ce", "weights", "accept_rates"):
            np.testing.assert_allclose(y[key], x[key], rtol=1e-5, err_msg=key)
    a, b = weights(one), weights(two)
    assert a.keys() == b.keys()
    for k in a:
        assert b[k].dtype == torch.float32
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)
    config = json.loads((two / "final" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    load_drafter(two / "final")  # every weight the format names, and no other


@pytest.mark.slow
def test_two_ddp_ranks_with_micro_batches_take_the_one_process_steps(
    one: Path, micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    """DDP replicas, two micro-batches of 2 rows on each rank (their acceptance counted by a
    forward without gradients before the step's)."""
    out = tmp_path / "ddp"
    run(torchrun(2, argv(micro_base, micro_dataset, out, "--micro-batch-size", "2")))
    assert_same_steps(one, out)
    assert not (out / "checkpoint-000002" / "sharded").exists()  # rank 0's optimizer state


@pytest.mark.slow
def test_two_fsdp_ranks_take_the_one_process_steps_and_resume(
    one: Path, micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    """FSDP2 shards, the whole share of a rank in one forward; a checkpoint holds every rank's
    shards beside the plain drafter. The run as it was after its checkpoint at step 2 (the
    later files removed), resumed on two ranks, ends bit-identical to the uninterrupted run,
    its log too."""
    out = tmp_path / "fsdp"
    run(torchrun(2, argv(micro_base, micro_dataset, out, "--fsdp")))
    assert_same_steps(one, out)
    shards = sorted(p.name for p in (out / "checkpoint-000002" / "sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]

    part = tmp_path / "part"
    shutil.copytree(out, part)
    shutil.rmtree(part / "final")
    shutil.rmtree(part / "checkpoint-000004")
    run(torchrun(2, argv(micro_base, micro_dataset, part, "--fsdp", "--resume")))
    a, b = weights(out), weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert timeless(part) == timeless(out)


def timeless(out: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in steps(out)]


def test_fsdp_without_torchrun_is_refused(
    micro_base: Path, micro_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming --fsdp, exit 2, nothing written."""
    out = tmp_path / "d"
    assert main(argv(micro_base, micro_dataset, out, "--fsdp")) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [
        "brisk: error: --fsdp: needs a process group; run under torchrun "
        "(torchrun --nproc-per-node P -m brisk.cli ...)"
    ]
    assert not out.exists()
