"""Ctrl-C and SIGTERM stop a run cleanly, and ``--resume`` finishes it bit-identically.

Each command runs in a real subprocess that is signalled once it has made progress: it must
exit with 130 and one line on stderr (no traceback), leaving what a rerun with ``--resume``
continues from; the resumed run must end where an uninterrupted run of the same settings ends
(every tensor equal, the event store and dataset equal). Under torchrun a signal to one rank
stops every rank at the same step; an experiment stopped mid-way finishes with the figures of
one never stopped when rerun; ``brisk decode`` keeps what it finished. Plus the signal handling
itself and the rules of a used run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from brisk._interrupt import (
    INTERRUPTED,
    Interrupted,
    StopSignals,
    exits_on_interrupt,
    stop_signals,
)
from brisk.cli import main
from brisk.experiments.proposal import ExperimentConfig, run_experiment
from brisk.mechanism import validate
from brisk.runtime.train.base.config import BaseTrainConfig
from brisk.runtime.train.base.recipe import train_base
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig
from brisk.runtime.train.corrector.events import collect_from_checkpoint
from brisk.runtime.train.corrector.recipe import train_corrector
from brisk.runtime.train.corrector.store import EventStore
from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.proposal.recipe import train_proposal
from brisk.runtime.train.selfgen import read_dataset
from tests.runtime.conftest import MICRO_SELFGEN, micro_experiment_toml

# -- the signal handling


def test_a_signal_mid_step_only_sets_the_flag_and_the_handlers_come_back() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_signals() as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # a second signal changes nothing
        assert (stop.requested, stop.name) == (True, "SIGTERM")
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_nested_block_shares_the_outer_flag() -> None:
    """A training run inside an experiment: one flag, so a signal that came before the inner
    block stops it at its first safe point, and one inside it reaches the outer loop too."""
    before = signal.getsignal(signal.SIGINT)
    with stop_signals() as outer:
        signal.raise_signal(signal.SIGTERM)
        with stop_signals() as inner:
            assert inner is outer
            assert inner.requested
        assert signal.getsignal(signal.SIGINT) == outer.handle  # the inner block restored nothing
    assert signal.getsignal(signal.SIGINT) == before


def abortable_work(stop: StopSignals, signals: int) -> None:
    with stop.abortable():
        for _ in range(signals):
            signal.raise_signal(signal.SIGINT)
        raise AssertionError("not interrupted")


def test_abortable_work_stops_at_the_first_signal_and_only_there() -> None:
    with stop_signals() as stop:
        with pytest.raises(KeyboardInterrupt):
            abortable_work(stop, 1)
        signal.raise_signal(signal.SIGINT)  # while saving what is left: recorded, not raised
        with pytest.raises(KeyboardInterrupt):  # entering once a signal came
            abortable_work(stop, 0)


class SignalledWhileFinalized:
    """An object whose finalizer is running when the signal comes (as a tokenizer's ``regex``
    object was, in a stopped experiment): a ``KeyboardInterrupt`` raised there would be printed
    as "Exception ignored in ... Traceback" and lost."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def finalizer_signalled_in_region(stop: StopSignals) -> None:
    with stop.abortable():
        SignalledWhileFinalized()  # finalized at once: the signal lands inside __del__
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
        raise AssertionError("the region was not aborted within 5 s")


def test_a_signal_during_a_finalizer_still_aborts_the_region_without_a_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with stop_signals() as stop:
        with pytest.raises(KeyboardInterrupt):
            finalizer_signalled_in_region(stop)
        assert stop.name == "SIGINT"
    err = capfd.readouterr().err
    assert "Exception ignored" not in err, err
    assert "Traceback" not in err, err


def test_the_command_line_turns_an_interruption_into_one_line_and_130(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(message: str) -> int:
        raise Interrupted(message) if message else KeyboardInterrupt

    assert exits_on_interrupt(run)("at step 2; saved x") == INTERRUPTED
    assert capsys.readouterr().err == "brisk: interrupted at step 2; saved x\n"
    assert exits_on_interrupt(run)("") == INTERRUPTED
    assert capsys.readouterr().err.count("\n") == 1


# -- a real process, signalled once it has made progress


def cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "brisk.cli", *argv]


def interrupt(
    cmd: list[str], ready: Callable[[], bool], sig: int = signal.SIGINT, times: int = 1
) -> str:
    """Start ``cmd``, send ``sig`` (``times`` times, like an impatient Ctrl-C) once ``ready()``;
    assert exit code 130 and a single line on stderr without a traceback, and return it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, f"finished before the signal: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "no progress in 120 s"
        time.sleep(0.02)
    for _ in range(times):
        proc.send_signal(sig)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("brisk: interrupted"), lines[0]
    return lines[0]


def records(metrics: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def steps_logged(path: Path) -> int:
    """Records with a step in a metrics file (which may be mid-write, or not there yet)."""
    try:
        return sum('"step"' in line for line in path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def assert_same_tensors(a: Path, b: Path) -> None:
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys()
    assert all(torch.equal(x[k], y[k]) for k in x)


def timeless(metrics: Path) -> list[dict[str, object]]:
    """The records without their clocks (and the start record's config, which names the
    output directory)."""
    drop = {"elapsed_s", "train_wall_s", "wall_s", "config"}
    return [{k: v for k, v in r.items() if k not in drop} for r in records(metrics)]


@pytest.fixture(scope="module")
def base_config(tmp_path_factory: pytest.TempPathFactory) -> tuple[BaseTrainConfig, Path]:
    """The smoke run at 120 steps (about 4 s), logging every step, and its config file."""
    cfg = BaseTrainConfig.smoke().replace(steps=120, log_every=1, save_every=40)
    file = tmp_path_factory.mktemp("config") / "base.json"
    file.write_text(json.dumps(cfg.to_dict()))
    return cfg, file


@pytest.fixture(scope="module")
def base_whole(
    base_config: tuple[BaseTrainConfig, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    cfg, _ = base_config
    out = tmp_path_factory.mktemp("whole")
    train_base(cfg.replace(out_dir=str(out)), show_progress=False)
    return out


def test_train_base_stops_on_sigint_and_resumes_bit_identically(
    base_config: tuple[BaseTrainConfig, Path], base_whole: Path, tmp_path: Path
) -> None:
    cfg, config = base_config
    part = tmp_path / "part"
    cmd = cli("train", "base", "--config", str(config), "--out", str(part), "--no-progress")
    line = interrupt(cmd, lambda: steps_logged(part / "metrics.jsonl") >= 10, times=3)
    saved = sorted(part.glob("checkpoint-*"))[-1]
    step = int(saved.name.split("-")[1])
    assert 10 <= step < cfg.steps
    assert f"at step {step}/{cfg.steps}; saved {saved} (rerun with --resume" in line
    assert (saved / "trainer_state.pt").is_file()
    assert not (part / "final").exists()
    assert not [p for p in part.iterdir() if p.name.startswith(".")]  # no half-written save
    assert max(r["step"] for r in records(part / "metrics.jsonl") if "step" in r) == step
    subprocess.run([*cmd, "--resume"], check=True, capture_output=True)
    assert_same_tensors(
        base_whole / "final" / "model.safetensors", part / "final" / "model.safetensors"
    )
    assert timeless(part / "metrics.jsonl") == timeless(base_whole / "metrics.jsonl")


@pytest.fixture
def killed(base_whole: Path, tmp_path: Path) -> Path:
    """The uninterrupted run as a kill after step 80 would leave it: checkpoints 40 and 80 and
    a log that goes on past them, no final/."""
    run = tmp_path / "killed"
    shutil.copytree(base_whole, run, ignore=shutil.ignore_patterns("final"))
    return run


def test_a_used_run_directory_is_never_overwritten(
    base_config: tuple[BaseTrainConfig, Path],
    base_whole: Path,
    killed: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --resume a used directory is refused (one line, exit 2, nothing touched);
    --resume with another configuration names what differs, and so does one with checkpoints
    it cannot continue exactly; a finished run is not retrained."""
    _, config = base_config
    argv = ["train", "base", "--config", str(config), "--no-progress", "--out"]
    before = {p: p.read_bytes() for p in killed.rglob("*") if p.is_file()}
    line = one_line([*argv, str(killed)], capsys)
    assert f"--out: {killed} already holds a run (checkpoint-000080, metrics.jsonl)" in line
    assert "pass --resume to continue it or choose another --out" in line
    line = one_line([*argv, str(killed), "--resume", "--steps", "100"], capsys)
    assert f"--resume: {killed / 'checkpoint-000080'} was trained with another" in line
    assert "steps: 120 ≠ 100" in line
    assert {p: p.read_bytes() for p in killed.rglob("*") if p.is_file()} == before
    for state in killed.glob("checkpoint-*/trainer_state.pt"):  # as an older brisk wrote them
        state.unlink()
    line = one_line([*argv, str(killed), "--resume"], capsys)
    assert f"--resume: {killed / 'checkpoint-000080'} has no trainer_state.pt" in line
    for flags in ([], ["--resume"]):
        line = one_line([*argv, str(base_whole), *flags], capsys)
        assert f"{base_whole} holds a finished run" in line


def test_resume_after_a_kill_drops_the_log_past_the_checkpoint(
    base_config: tuple[BaseTrainConfig, Path], base_whole: Path, killed: Path
) -> None:
    cfg, _ = base_config
    result = train_base(cfg.replace(out_dir=str(killed)), show_progress=False, resume=True)
    assert_same_tensors(
        base_whole / "final" / "model.safetensors", result.checkpoint / "model.safetensors"
    )
    assert timeless(killed / "metrics.jsonl") == timeless(base_whole / "metrics.jsonl")


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command in this process; assert exit code 2 and one line on stderr."""
    capsys.readouterr()
    threads = torch.get_num_threads()  # the decode commands set it from --threads
    try:
        assert main(argv) == 2
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


# -- selfgen, corrector collect and corrector training


def test_selfgen_stops_on_sigint_and_resumes_to_the_same_dataset(
    micro_base: Path, micro_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data"
    o = MICRO_SELFGEN
    argv = (
        f"train selfgen --checkpoint {micro_base} --out {out} --problems {o.problems} "
        f"--samples {o.samples} --stride {o.stride} --max-new-tokens {o.max_new_tokens} "
        f"--chunk {o.chunk} --threads 1 --no-progress"
    ).split()
    line = interrupt(cli(*argv), lambda: (out / "part-00000.parquet").exists())
    parts = sorted(out.glob("part-*.parquet"))
    assert f"interrupted after {len(parts)}/3 parts" in line
    assert f"they stay in {out} (rerun with --resume to continue)" in line
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no half-written part
    assert f"already holds a dataset ({len(parts)} of 3 parts); pass --resume" in one_line(
        argv, capsys
    )
    done = subprocess.run(cli(*argv, "--resume"), capture_output=True, text=True, check=True)
    assert f"{3 - len(parts)} parts written, {len(parts)} resumed" in done.stdout
    assert read_dataset(out).equals(read_dataset(micro_dataset))


# 120 responses in decode batches of 4: 30 batches, the unit a signal can lose.
COLLECT = CollectOptions(problems=60, samples=2, stride=4, top_k=8, max_new_tokens=24, batch_size=4)


@pytest.fixture(scope="module")
def events(micro_base: Path, tmp_path_factory: pytest.TempPathFactory) -> EventStore:
    """The store of an uninterrupted collection (one thread, like the commands below)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("events") / "whole"
        return collect_from_checkpoint(micro_base, out, COLLECT, show_progress=False)
    finally:
        torch.set_num_threads(threads)


def assert_same_store(a: EventStore, b: EventStore) -> None:
    """Every array of the two stores equal (NaN where NaN), and their metadata."""
    for field in dataclasses.fields(EventStore):
        if field.name not in ("path", "meta"):
            x, y = getattr(a, field.name), getattr(b, field.name)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=field.name)
    assert a.meta == b.meta


def test_collect_stops_on_sigint_and_resumes_to_the_same_store(
    micro_base: Path, events: EventStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "store"
    partial = tmp_path / ".store.partial"
    c = COLLECT
    argv = (
        f"train corrector collect --checkpoint {micro_base} --out {out} --problems {c.problems} "
        f"--samples {c.samples} --stride {c.stride} --top-k {c.top_k} "
        f"--max-new-tokens {c.max_new_tokens} --batch-size {c.batch_size} --threads 1 "
        f"--no-progress"
    ).split()
    line = interrupt(cli(*argv), lambda: (partial / "_progress.json").exists())
    progress = json.loads((partial / "_progress.json").read_text())
    done = progress["requests"]
    assert 0 < done < 120
    assert done % c.batch_size == 0  # whole batches only
    assert f"interrupted after {done}/120 requests" in line
    assert f"they stay in {partial} (rerun with --resume to continue)" in line
    assert not out.exists()
    assert sorted(p.name for p in partial.iterdir()) == ["_progress.json", "blocks", "features"]
    assert f"{partial} holds an interrupted collection into {out}" in one_line(argv, capsys)
    subprocess.run(cli(*argv, "--resume"), capture_output=True, check=True)
    assert not partial.exists()
    assert_same_store(EventStore.open(out), events)


def test_corrector_training_stops_on_sigterm_and_resumes_bit_identically(
    events: EventStore, tmp_path: Path
) -> None:
    cfg = CorrectorTrainConfig(
        events=str(events.path),
        out_dir=str(tmp_path / "whole"),
        K=8,
        head="small",
        only_correct=False,
        epochs=8,
        batch_size=16,
        lr=3e-3,
        log_every=1,
    )
    whole = train_corrector(cfg, show_progress=False)
    config = tmp_path / "head.json"
    config.write_text(json.dumps(cfg.to_dict()))
    part = tmp_path / "part"
    cmd = cli("train", "corrector", "--config", str(config), "--out", str(part), "--no-progress")
    line = interrupt(cmd, lambda: steps_logged(part / "metrics.jsonl") >= 20, signal.SIGTERM)
    saved = sorted(part.glob("checkpoint-*"))[-1]
    step = int(saved.name.split("-")[1])
    assert 0 < step < whole.steps
    assert f"at step {step}/{whole.steps}; saved {saved} (rerun with --resume" in line
    subprocess.run([*cmd, "--resume"], check=True, capture_output=True)
    assert_same_tensors(
        whole.checkpoint / "model.safetensors", part / "final" / "model.safetensors"
    )
    assert timeless(part / "metrics.jsonl") == timeless(tmp_path / "whole" / "metrics.jsonl")


# -- proposal training, alone and under torchrun


@pytest.fixture(scope="module")
def proposal_config(
    micro_base: Path, micro_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ProposalTrainConfig, Path]:
    """18 steps on the micro data (about 2 s), logging every step, and its config file."""
    cfg = ProposalTrainConfig(
        init=str(micro_base),
        dataset=str(micro_dataset),
        data="selfgen-all",
        stride=4,
        token_budget=4000,
        batch_size=16,
        lr=1e-3,
    )
    file = tmp_path_factory.mktemp("config") / "proposal.json"
    file.write_text(json.dumps(cfg.to_dict()))
    return cfg, file


def test_proposal_training_stops_on_sigint_and_resumes_bit_identically(
    proposal_config: tuple[ProposalTrainConfig, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, config = proposal_config
    whole = train_proposal(cfg.replace(out_dir=str(tmp_path / "whole")), show_progress=False)
    part = tmp_path / "part"
    argv = ["train", "proposal", "--config", str(config), "--out", str(part), "--no-progress"]
    line = interrupt(cli(*argv), lambda: steps_logged(part / "metrics.jsonl") >= 3)
    saved = sorted(part.glob("checkpoint-*"))[-1]
    step = int(saved.name.split("-")[1])
    assert 3 <= step < whole.steps
    assert f"at step {step} (" in line
    assert f"/4,000 tokens); saved {saved} (rerun with --resume to continue)" in line
    assert not [p for p in part.iterdir() if p.name.startswith(".")]  # no half-written save
    assert f"--out: {part} already holds a run ({saved.name}, metrics.jsonl)" in one_line(
        argv, capsys
    )
    subprocess.run(cli(*argv, "--resume"), check=True, capture_output=True)
    assert_same_tensors(
        whole.checkpoint / "model.safetensors", part / "final" / "model.safetensors"
    )
    assert timeless(part / "metrics.jsonl") == timeless(tmp_path / "whole" / "metrics.jsonl")


def rank_pids(agent: int) -> dict[int, int]:
    """torchrun's worker processes by rank (Linux: the agent's children and their RANK)."""
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    ranks = {}
    for pid in children:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next(v for k, _, v in (e.partition(b"=") for e in env) if k == b"RANK")
        ranks[int(rank)] = int(pid)
    return ranks


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the ranks in /proc")
def test_torchrun_ranks_stop_at_one_step_when_one_rank_is_signalled(
    proposal_config: tuple[ProposalTrainConfig, Path], tmp_path: Path
) -> None:
    """SIGTERM to rank 1 alone: the all-reduced flag stops both ranks at the same step (else
    rank 0 would wait in the next step's collectives until the timeout), rank 0 saves that
    step and alone prints a line; torchrun --resume then ends bit-identical to an
    uninterrupted torchrun run."""
    _, config = proposal_config
    torchrun = (
        f"{sys.executable} -m torch.distributed.run --nproc-per-node 2 "
        f"--standalone -m brisk.cli train proposal --config {config} --no-progress --out"
    ).split()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    part, whole = tmp_path / "part", tmp_path / "whole"
    proc = subprocess.Popen(
        [*torchrun, str(part)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 120
    while steps_logged(part / "metrics.jsonl") < 3:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no progress in 120 s"
        time.sleep(0.02)
    os.kill(rank_pids(proc.pid)[1], signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports its failed workers after them
    said = [line for line in err.splitlines() if line.startswith("brisk:")]
    assert len(said) == 1, err
    saved = sorted(part.glob("checkpoint-*"))[-1]
    assert f"saved {saved} (rerun with --resume to continue)" in said[0]
    for argv in ([*torchrun, str(part), "--resume"], [*torchrun, str(whole)]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    assert_same_tensors(whole / "final" / "model.safetensors", part / "final" / "model.safetensors")
    assert timeless(part / "metrics.jsonl") == timeless(whole / "metrics.jsonl")


# -- an experiment, and brisk decode

CLOCKS = ("tokens_per_s", "tokens_per_s_net", "head_s")


def figures(run: Path) -> list[dict[str, object]]:
    """Every evaluation figure of an experiment's ``summary.json`` but the clocks."""
    evals = json.loads((run / "summary.json").read_text())["evals"]
    return [{k: v for k, v in e.items() if k not in CLOCKS} for e in evals]


@pytest.mark.slow
def test_an_experiment_stops_on_sigint_and_a_rerun_finishes_it(
    micro_base: Path, tmp_path: Path
) -> None:
    """The micro ablation of test_experiment_proposal, smaller, signalled once its training job
    has logged a step (the main process alone: it tells its workers): one line, 130; the rerun
    skips what is done, continues the rest and ends with an uninterrupted run's figures."""
    for name in ("whole", "part"):
        text = micro_experiment_toml(
            tmp_path / name, micro_base, [0], ["base", "selfgen-correct-uniform"], workers=2
        )
        (tmp_path / f"{name}.toml").write_text(text)
    run_experiment(ExperimentConfig.load(tmp_path / "whole.toml"), show_progress=False)
    part = tmp_path / "part"
    cmd = cli("experiment", "proposal", "--config", str(tmp_path / "part.toml"), "--no-progress")
    training = part / "arms" / "selfgen-correct-uniform" / "seed0" / "metrics.jsonl"
    line = interrupt(cmd, lambda: steps_logged(training) >= 1)
    assert line.startswith(f"brisk: interrupted while running the arm × seed jobs in {part}")
    assert line.endswith("; rerun the same command to continue")
    assert "/2 jobs had finished" in line
    assert not (part / "summary.json").exists()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert done.stderr == ""
    assert figures(part) == figures(tmp_path / "whole")


def test_decode_stops_on_sigterm_and_keeps_what_finished(micro_base: Path, tmp_path: Path) -> None:
    """SIGTERM does what Ctrl-C does (test_decode_cli): the finished completions in --out, a
    valid block log, one line, 130."""
    prompts, out, log = tmp_path / "p.jsonl", tmp_path / "out.jsonl", tmp_path / "log"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Q: {a % 10}+{a % 7}=?\n"}) + "\n" for a in range(2000))
    )
    partial = tmp_path / ".out.jsonl.partial"  # completions appear here as they finish
    cmd = cli(
        *f"decode --model {micro_base} --prompts {prompts} --max-new-tokens 16 --temperature 1 "
        f"--batch-size 2 --threads 1 --out {out} --log-blocks {log}".split()
    )

    def finished_one() -> bool:
        return partial.exists() and partial.read_text().count("\n") >= 1

    line = interrupt(cmd, finished_one, signal.SIGTERM)
    rows = [json.loads(r) for r in out.read_text().splitlines()]
    assert 1 <= len(rows) < 2000
    assert line == (
        f"brisk: interrupted after {len(rows)}/2000 requests; wrote {len(rows)} completions to "
        f"{out} and {validate(log)} blocks to {log}"
    )
    assert not partial.exists()
