"""Training under torchrun with FSDP2 (gloo on this CPU): the same step as one process at the
same global batch, whatever the number of ranks and micro-batches; SIGKILL and resume (DCP
shards) to the same bits, also on another world size; bf16 mixed precision with activation
checkpointing; bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.proposal.recipe import train_proposal
from tests.runtime.conftest import brisk_here, proposal_args, torchrun

pytestmark = pytest.mark.slow

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
if torch.cuda.device_count() < 2:  # two ranks take a GPU each; with fewer, both runs use the CPU
    ENV["CUDA_VISIBLE_DEVICES"] = ""
STEPS = 7  # 1,500 tokens at a global batch of 16


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def records(out: Path) -> list[dict[str, Any]]:
    """The run's ``train`` records."""
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in logged if r["event"] == "train"]


def timeless(out: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records(out)]


def params(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


FSDP = ("--fsdp", "--micro-batch-size", "4", "--save-every", "3")  # 2 micro-batches per rank


@pytest.fixture(scope="module")
def runs(
    micro_base: Path, micro_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """One process (whole batch per forward) and two FSDP ranks (two micro-batches each)."""
    root = tmp_path_factory.mktemp("fsdp")
    one, two = root / "one", root / "two"
    run([sys.executable, "-m", "brisk.cli", *proposal_args(micro_base, micro_dataset, one)])
    run(torchrun(2, proposal_args(micro_base, micro_dataset, two, *FSDP)))
    return {"one": one, "fsdp": two, "root": root}


def test_two_fsdp_ranks_with_accumulation_match_one_process(runs: dict[str, Path]) -> None:
    """Acceptance counts and token counts exact (integers); weights to rtol 1e-6, losses to
    rtol 1e-5, final parameters to atol 1e-5 (the same sums in another order)."""
    r1, r2 = records(runs["one"]), records(runs["fsdp"])
    assert len(r1) == len(r2) == STEPS
    for x, y in zip(r1, r2, strict=True):
        assert (x["batch_reached"], x["batch_accepted"], x["tokens"]) == (
            y["batch_reached"],
            y["batch_accepted"],
            y["tokens"],
        )
        np.testing.assert_allclose(y["weights"], x["weights"], rtol=1e-6)
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
    a, b = params(runs["one"]), params(runs["fsdp"])
    assert a.keys() == b.keys()
    for k in a:
        assert b[k].dtype == torch.float32
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)
    # a checkpoint holds the plain weights and every rank's shard of model and optimizer
    shards = sorted(p.name for p in (runs["fsdp"] / "checkpoint-000003" / "sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def kill_at_checkpoint(cmd: list[str], out: Path, checkpoint: str) -> None:
    """Start ``cmd`` (torchrun) and SIGKILL every rank and torchrun itself once ``checkpoint``
    is complete: torchrun starts its workers in sessions of their own, so each is killed by its
    own PID."""
    proc = subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300
    try:
        while not (out / checkpoint / "trainer_state.pt").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.02)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "final").exists()


def test_sigkilled_fsdp_run_resumes_to_the_same_bits_on_any_world_size(
    runs: dict[str, Path], micro_base: Path, micro_dataset: Path
) -> None:
    """Killed after its first checkpoint: resumed on 2 ranks it ends bit-identical to the
    uninterrupted FSDP run (parameters and log); resumed on 1 rank DCP reshards the optimizer
    state and the run ends within atol 1e-6 of it."""
    part, resharded = runs["root"] / "part", runs["root"] / "resharded"
    cmd = torchrun(2, proposal_args(micro_base, micro_dataset, part, *FSDP))
    kill_at_checkpoint(cmd, part, "checkpoint-000003")
    shutil.copytree(part, resharded)
    run([*cmd, "--resume"])
    a, b = params(runs["fsdp"]), params(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert timeless(part) == timeless(runs["fsdp"])  # the log too: nothing lost, nothing twice

    run(torchrun(1, proposal_args(micro_base, micro_dataset, resharded, *FSDP, "--resume")))
    c = params(resharded)
    for k in a:
        torch.testing.assert_close(c[k], a[k], rtol=0, atol=1e-6)


def test_bf16_with_activation_checkpointing(
    runs: dict[str, Path], micro_base: Path, micro_dataset: Path
) -> None:
    """bf16 compute, fp32 master weights: the saved weights are fp32, every step's loss is the
    fp32 run's to 5 % (bf16 keeps 8 significant bits), and training moved the weights."""
    out = runs["root"] / "bf16"
    run(
        torchrun(
            2,
            proposal_args(
                micro_base,
                micro_dataset,
                out,
                "--fsdp",
                "--precision",
                "bf16",
                "--activation-checkpointing",
            ),
        )
    )
    for x, y in zip(records(runs["one"]), records(out), strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=0.05)
    init = load_file(micro_base / "model.safetensors")
    b = params(out)
    assert all(v.dtype == torch.float32 for v in b.values())
    assert any(not torch.equal(b[k], init[k]) for k in init)


def test_checkpointing_and_micro_batches_in_one_process(
    runs: dict[str, Path], micro_base: Path, micro_dataset: Path
) -> None:
    """In one process, activation checkpointing with 2 micro-batches of 8 is the plain step:
    losses to rtol 1e-6 and parameters to atol 1e-6 of the whole-batch run."""
    out = runs["root"] / "ac"
    cfg = ProposalTrainConfig(
        init=str(micro_base),
        dataset=str(micro_dataset),
        out_dir=str(out),
        data="selfgen-all",
        stride=4,
        token_budget=1500,
        batch_size=16,
        lr=1e-3,
        activation_checkpointing=True,
        micro_batch_size=8,
    )
    train_proposal(cfg, show_progress=False)
    for x, y in zip(records(runs["one"]), records(out), strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-6)
    a, b = params(runs["one"]), params(out)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)


BASE_TOML = """
steps = 12
batch_size = 16
warmup_steps = 4
strides = [2, 4]
log_every = 1
final_eval_problems = 0
eval_problems = 0
save_every = 0
[task]
max_operands = 2
max_digits = 1
ops = "+"
style_weights = [1.0, 0.0, 0.0, 0.0]
reference_weights = [1.0, 0.0, 0.0, 0.0]
verb_weights = [1.0, 0.0, 0.0]
[model]
hidden_size = 64
layers = 2
intermediate_size = 128
max_positions = 128
"""


def test_base_training_under_fsdp_matches_one_process(tmp_path: Path) -> None:
    """Base (I-DLM) training: two FSDP ranks with two micro-batches each against one process
    at the same global batch: losses to rtol 1e-5, parameters to atol 1e-5."""
    config = tmp_path / "base.toml"
    config.write_text(BASE_TOML)
    args = ["train", "base", "--config", str(config), "--no-progress", "--threads", "1"]
    run([sys.executable, "-m", "brisk.cli", *args, "--out", str(tmp_path / "one")])
    run(torchrun(2, [*args, "--out", str(tmp_path / "two"), "--fsdp", "--micro-batch-size", "4"]))
    train = [[r for r in records(tmp_path / d) if r["event"] == "train"] for d in ("one", "two")]
    assert len(train[0]) == len(train[1]) == 12
    for x, y in zip(*train, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
        np.testing.assert_allclose(y["slot_ce"], x["slot_ce"], rtol=1e-5)
    a, b = params(tmp_path / "one"), params(tmp_path / "two")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)


def test_bad_input(micro_base: Path, micro_dataset: Path, tmp_path: Path) -> None:
    """--fsdp without a process group: one line, exit 2; a world size that does not divide the
    global batch: each rank's one line names the option; nothing is written either way."""
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brisk.cli",
            *proposal_args(micro_base, micro_dataset, out, "--fsdp"),
        ],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "brisk: error: --fsdp: needs a process group; run under torchrun "
        "(torchrun --nproc-per-node P -m brisk.cli ...)"
    ]
    args = proposal_args(micro_base, micro_dataset, out, "--fsdp")
    args[args.index("--batch-size") + 1] = "15"
    done = subprocess.run(torchrun(2, args), capture_output=True, text=True, env=ENV)
    assert done.returncode != 0
    line = "brisk: error: --batch-size: the global batch 15 is not divisible by the world size 2"
    assert done.stderr.count(line) == 2, done.stderr[-2000:]
    assert not out.exists()


def test_resuming_with_another_sharding_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    """A run saved under FSDP continued without it (or the reverse): one line naming the
    setting, exit 2; the checkpoint is untouched."""
    part = tmp_path / "part"
    shutil.copytree(runs["fsdp"], part, ignore=shutil.ignore_patterns("final"))
    config = json.loads((part / "checkpoint-000006" / "proposal_config.json").read_text())
    args = proposal_args(
        Path(config["init"]),
        Path(config["dataset"]),
        part,
        "--save-every",
        "3",
        "--micro-batch-size",
        "4",
        "--resume",
    )
    done = brisk_here(*args)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "was trained with another configuration (fsdp: True ≠ False)" in line
    assert sorted(p.name for p in part.iterdir()) == [
        "checkpoint-000003",
        "checkpoint-000006",
        "metrics.jsonl",
        "weights.png",
    ]


def test_examples_longer_than_the_model_are_refused(micro_base: Path) -> None:
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from brisk.runtime.train.proposal.data import Example, check_lengths

    tokenizer = AutoTokenizer.from_pretrained(micro_base)
    examples = [Example("1+1=", "2"), Example("1+1=", "2" * 40)]
    check_lengths(examples[:1], tokenizer, SimpleNamespace(max_position_embeddings=16), "D")
    with pytest.raises(
        ValueError,
        match=r"--dataset: example 1 of D has \d+ tokens, longer than "
        r"the model's 16 positions",
    ):
        check_lengths(examples, tokenizer, SimpleNamespace(max_position_embeddings=16), "D")
