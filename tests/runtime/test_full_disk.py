"""A disk that fills while brisk writes: the command ends in one line naming what failed, exit 2,
what was complete before stays (a checkpoint, the log so far) and nothing half-written is left
behind; the rerun (``--resume``) continues from the last complete state.

The full disk is simulated two ways: ``RLIMIT_FSIZE`` on a subprocess (Python ignores SIGXFSZ,
so the write fails with ``EFBIG``, "File too large", where the real file would have grown), and
an ``OSError(ENOSPC)`` injected at the trainer state's ``torch.save``.
"""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from brisk.cli import main
from tests.runtime.conftest import tiny_base_toml

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))  # any write past one byte fails


def brisk(args: list[str], limited: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brisk.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size if limited else None,
        check=False,
    )


def test_decode_on_a_full_disk_ends_in_one_line_and_leaves_no_block_log(
    micro_base: Path, tmp_path: Path
) -> None:
    """``brisk decode --log-blocks`` whose block part cannot be written: exit 2, one line
    naming the failure (it was a 31-43-line traceback, raised again in the decoder's
    ``finally``), no block log left (an incomplete one read as a log without its request
    table, and refused the rerun's ``--log-blocks``); the rerun on a free disk writes it."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Q: {a}+1=?\n"}) + "\n" for a in range(4)))
    log = tmp_path / "log"
    argv = ["decode", "--model", str(micro_base), "--prompts", str(prompts), "--stride", "4"]
    argv += ["--max-new-tokens", "16", "--log-blocks", str(log), "--no-progress"]
    full = brisk(argv, limited=True)
    assert full.returncode == 2, full.stderr[-2000:]
    assert "Traceback" not in full.stderr
    said = [line for line in full.stderr.splitlines() if line.startswith("brisk:")]
    assert len(said) == 1
    assert "File too large" in said[0] or "file too large" in said[0], said
    assert not log.exists()
    again = brisk(argv)
    assert again.returncode == 0, again.stderr[-2000:]
    checked = brisk(["mechanism", "validate", str(log)])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no request table" not in checked.stdout


BASE_TOML = tiny_base_toml(steps=9, batch_size=8, save_every=3)


def train_steps(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "train"]


def test_a_checkpoint_save_on_a_full_disk_keeps_the_last_one_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``brisk train base`` whose second checkpoint's trainer state hits a full disk: exit 2,
    one line; ``checkpoint-000003`` whole, no ``.checkpoint-000006.tmp`` (it was left, after a
    42-line traceback); ``--resume`` on a free disk ends where an uninterrupted run ends, no
    step logged twice."""
    import brisk.runtime.train.resume as resume

    config = tmp_path / "base.toml"
    config.write_text(BASE_TOML)
    args = ["train", "base", "--config", str(config), "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0

    out = tmp_path / "full"
    saved = torch.save
    calls = {"n": 0}

    def fills_up(obj: Any, f: Any, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        saved(obj, f, *a, **k)

    monkeypatch.setattr(resume.torch, "save", fills_up)
    capsys.readouterr()
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("brisk: error: ")
    assert "No space left on device" in err[0]
    assert ".checkpoint-000006.tmp" in err[0]  # the file it was writing
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint", "."))) == [
        "checkpoint-000003"
    ]
    monkeypatch.setattr(resume.torch, "save", saved)
    assert main([*args, "--out", str(out), "--resume"]) == 0
    assert train_steps(out) == train_steps(tmp_path / "whole") == list(range(1, 10))
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(out / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_selfgen_on_a_full_disk_keeps_its_whole_parts_and_resumes_to_the_same_dataset(
    micro_base: Path,
    micro_dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``brisk train selfgen`` whose second part hits a full disk: exit 2, one line; the first
    part whole, no temporary part left; ``--resume`` on a free disk writes the rest, and the
    dataset equals the uninterrupted one row for row."""
    import pyarrow.parquet as pq

    from brisk.runtime.train.selfgen import read_dataset
    from tests.runtime.conftest import MICRO_SELFGEN as o

    out = tmp_path / "data"
    argv = ["train", "selfgen", "--checkpoint", str(micro_base), "--out", str(out)]
    argv += ["--problems", str(o.problems), "--samples", str(o.samples), "--stride", str(o.stride)]
    argv += ["--max-new-tokens", str(o.max_new_tokens), "--chunk", str(o.chunk), "--no-progress"]
    written = pq.write_table
    calls = {"n": 0}

    def fills_up(table: Any, where: Any, *a: Any, **k: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # as a full disk does: some bytes of the file, then the error
            Path(where).write_bytes(b"PAR1\x15\x04")
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        written(table, where, *a, **k)

    monkeypatch.setattr(pq, "write_table", fills_up)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "No space left on device" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["_provenance.json", "part-00000.parquet"]
    monkeypatch.setattr(pq, "write_table", written)
    assert main([*argv, "--resume"]) == 0
    assert read_dataset(out).equals(read_dataset(micro_dataset))
