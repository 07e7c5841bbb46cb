"""A writer killed with SIGKILL mid-run loses only rows it had not yet reported as flushed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from brisk.mechanism import BlockLogWriter, count_blocks, read_blocks, synthetic_blocks, validate

CHILD = """
import sys
from brisk.mechanism import BlockLogWriter, synthetic_blocks
with BlockLogWriter(sys.argv[1], 7, 16, rows_per_group=500) as writer:
    for batch in synthetic_blocks(2_000_000, seed=3, batch_rows=100):
        writer.write(batch)
        print(writer.rows_flushed, flush=True)
"""


def test_sigkill_keeps_every_flushed_row_group(tmp_path: Path) -> None:
    log = tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(log)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    reported = 0
    for line in child.stdout:
        reported = int(line)
        if reported >= 3000:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert reported >= 3000
    rows = count_blocks(log)
    assert rows >= reported
    assert rows % 500 == 0  # whole row groups only
    assert validate(log) == rows
    got = {
        name: np.concatenate([b[name] for b in read_blocks(log)])
        for name in ("q", "u", "request_id")
    }
    expected = synthetic_blocks(2_000_000, seed=3, batch_rows=100)
    want = {name: [] for name in got}
    have = 0
    for batch in expected:
        for name in got:
            want[name].append(batch[name])
        have += len(batch["q"])
        if have >= rows:
            break
    for name in got:
        np.testing.assert_array_equal(got[name], np.concatenate(want[name])[:rows], name)


def test_leaving_the_block_by_an_exception_still_flushes_valid_rows(tmp_path: Path) -> None:
    batch = next(synthetic_blocks(30, seed=4))

    def serve() -> None:
        with BlockLogWriter(tmp_path / "log", 7, 16) as writer:
            writer.write(batch)
            raise RuntimeError("the server went away")

    with pytest.raises(RuntimeError, match="went away"):
        serve()
    assert count_blocks(tmp_path / "log") == 30
    assert not [p for p in (tmp_path / "log").iterdir() if p.name.endswith(".tmp")]
