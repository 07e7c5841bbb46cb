"""Cheap start-up: the CLI, brisk.theory and brisk.mechanism never import torch or transformers.

Each check runs in a fresh interpreter (this test process has torch loaded already) and prints
which heavy modules ended up in ``sys.modules``. Timing is not asserted here: a loaded CI
machine would make such a test flaky, and the module check is what keeps start-up cheap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers")

CASES = [
    pytest.param("import brisk.cli; brisk.cli.build_parser()", id="cli-parser"),
    pytest.param(
        "import brisk.cli\ntry:\n    brisk.cli.main(['--help'])\nexcept SystemExit:\n    pass",
        id="cli-help",
    ),
    pytest.param(
        "import brisk.cli; brisk.cli.main(['theory', 'tpf', '--a', '0.9,0.8'])", id="cli-theory"
    ),
    pytest.param("import brisk.theory; brisk.theory.tpf([0.9, 0.8])", id="theory"),
    pytest.param(
        "import numpy as np\n"
        "import brisk.theory as t\n"
        "a = np.array([[0.9, 0.8, 0.7], [0.5, 0.6, 0.9]])\n"
        "t.survival(a); t.accept_length_pmf(a); t.expected_accept_length(a); t.fpt(a)\n"
        "t.progress_weights(a); t.dpace_weights(a); t.isd_tpf_uniform(0.1, 8)\n"
        "t.speculative_tpf_uniform(0.8, 3); t.simulate(a, n_cycles=10)\n"
        "t.tokens_per_second(4.0, 0.02); t.wall_clock_speedup(4.0, 5.0, 0.03)\n"
        "p = t.AcceptanceProfile.from_accept_lengths([0, 1, 3, 3], 3)\n"
        "p.tpf(); p.interval(); p.tpf_interval(draws=10)\n"
        "t.run_tpf(a, [5, 9]); t.predict_run_tpf(p, [5, 9], draws=10)",
        id="theory-numpy-api",
    ),
    pytest.param("import brisk.mechanism", id="mechanism"),
    pytest.param("import brisk.cli.mechanism", id="mechanism-cli"),
    # brisk.cli.train and brisk.cli.decode must import torch inside their run functions only.
    pytest.param("import brisk.cli.train, brisk.cli.decode", id="runtime-cli"),
]


def _heavy_modules_after(code: str) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("code", CASES)
def test_no_torch_or_transformers_at_start_up(code: str) -> None:
    assert _heavy_modules_after(code) == []


def test_a_tensor_input_is_still_served() -> None:
    """The other direction: torch is used (not just tolerated) once the caller brings it."""
    code = (
        "import torch\n"
        "import brisk.theory as t\n"
        "a = torch.tensor([0.9, 0.8], dtype=torch.float64, requires_grad=True)\n"
        "out = t.tpf(a); out.backward()\n"
        "assert isinstance(out, torch.Tensor) and a.grad is not None"
    )
    assert _heavy_modules_after(code) == ["torch"]
