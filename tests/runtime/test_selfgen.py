"""Self-generated data: what each row holds, its provenance, resumption after a kill, readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from brisk.runtime.train.selfgen import (
    META_KEY,
    checkpoint_hash,
    dataset_profile,
    generate_dataset,
    read_dataset,
    read_provenance,
)
from brisk.theory import AcceptanceProfile
from brisk.worlds.arithmetic.grader import grade
from tests.runtime.conftest import MICRO_SELFGEN, brisk_here


def test_rows_are_graded_samples_with_their_isd_profile(micro_dataset: Path) -> None:
    table = read_dataset(micro_dataset)
    rows = table.to_pylist()
    R, M = MICRO_SELFGEN.samples, MICRO_SELFGEN.stride - 1
    assert len(rows) == MICRO_SELFGEN.problems * R
    assert [(r["problem"], r["sample"]) for r in rows] == [
        (i, s) for i in range(MICRO_SELFGEN.problems) for s in range(R)
    ]
    assert len({r["seed"] for r in rows}) == len(rows)  # every response its own decode seed
    for r in rows:
        assert r["correct"] == grade(r["response"], r["answer"])
        assert r["finished"] in ("eos", "length")
        # The counts are the ISD rule applied to the response's own accept lengths: position i
        # reached iff L ≥ i − 1, accepted iff L ≥ i (nothing after the first rejection).
        p = AcceptanceProfile.from_accept_lengths(np.array(r["accept_lengths"], int), M)
        assert r["reached"] == p.reached.tolist()
        assert r["accepted"] == p.accepted.tolist()
    assert 0 < sum(r["correct"] for r in rows) < len(rows)  # the micro model is neither
    total = dataset_profile(table, M)
    assert total.reached.tolist() == np.sum([r["reached"] for r in rows], 0).tolist()


def test_provenance_names_checkpoint_and_decoder(micro_base: Path, micro_dataset: Path) -> None:
    prov = read_provenance(micro_dataset)
    assert prov["checkpoint_hash"] == checkpoint_hash(micro_base)
    assert prov["decoder"] == {
        "algorithm": "isd",
        "head": "off",
        "stride": 4,
        "M": 3,
        "temperature": 1.0,
        "top_k": 16,
        "max_new_tokens": 24,
    }
    for part in sorted(micro_dataset.glob("part-*.parquet")):
        meta = pq.read_schema(part).metadata
        assert json.loads(meta[META_KEY]) == prov


def test_pandas_and_hf_datasets_read_it(micro_dataset: Path) -> None:
    import pandas as pd
    from datasets import load_dataset

    frame = pd.read_parquet(micro_dataset)
    assert len(frame) == MICRO_SELFGEN.problems * MICRO_SELFGEN.samples
    assert {"prompt", "response", "correct", "seed", "reached"} <= set(frame.columns)
    ds = load_dataset("parquet", data_files=f"{micro_dataset}/*.parquet", split="train")
    assert ds.num_rows == len(frame)
    assert ds[0]["response"] == frame.iloc[0]["response"]


def test_resume_after_kill_gives_the_same_dataset(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    """SIGKILL the generator once its first part is on disk; a rerun with --resume continues
    after the last complete part and the result equals the uninterrupted dataset row for row."""
    out = tmp_path / "data"
    o = MICRO_SELFGEN
    cmd = [
        sys.executable,
        "-m",
        "brisk.cli",
        "train",
        "selfgen",
        "--checkpoint",
        str(micro_base),
        "--out",
        str(out),
        "--problems",
        str(o.problems),
        "--samples",
        str(o.samples),
        "--stride",
        str(o.stride),
        "--max-new-tokens",
        str(o.max_new_tokens),
        "--chunk",
        str(o.chunk),
        "--threads",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "part-00000.parquet").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    parts = sorted(p.name for p in out.glob("part-*.parquet"))
    assert parts
    if "part-00002.parquet" in parts:
        # The kill came after the last part (the poll and the kill lost a race on a loaded
        # machine): the parts after the first go, the state a kill at the first part's end
        # leaves, so the resume still has parts to write.
        for name in parts[1:]:
            (out / name).unlink()
        parts = parts[:1]
    done = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, check=True)
    assert f"{len(parts)} resumed" in done.stdout
    assert read_dataset(out).equals(read_dataset(micro_dataset))


def test_other_settings_in_the_same_directory_are_refused(
    micro_base: Path, micro_dataset: Path
) -> None:
    before = sorted(micro_dataset.iterdir())
    with pytest.raises(ValueError, match="another checkpoint or other options"):
        generate_dataset(
            micro_base, micro_dataset, replace(MICRO_SELFGEN, temperature=0.5), show_progress=False
        )
    assert sorted(micro_dataset.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--checkpoint", "/nonexistent"],
            "--checkpoint: /nonexistent is not a",
            id="missing-checkpoint",
        ),
        pytest.param(["--samples", "0"], "--samples: must be an integer ≥ 1", id="samples"),
        pytest.param(["--stride", "1"], "--stride: need an integer N ≥ 2", id="stride"),
    ],
)
def test_bad_input_is_one_line(
    args: list[str], message: str, micro_base: Path, tmp_path: Path
) -> None:
    base = ["train", "selfgen", "--checkpoint", str(micro_base), "--out", str(tmp_path / "d")]
    done = brisk_here(*base, *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2
    assert len(lines) == 1
    assert lines[0].startswith("brisk: error: ")
    assert message in lines[0]
