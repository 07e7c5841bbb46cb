"""Cheap start-up: ``brisk mechanism`` reads and writes Parquet and never needs torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import brisk.mechanism

ROOT = Path(__file__).resolve().parents[2]


def test_no_module_of_brisk_mechanism_imports_torch() -> None:
    for path in sorted(Path(brisk.mechanism.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "torch" for n in names), f"{path}:{node.lineno}"


def _imports_torch(module: str) -> bool:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip() == "True"


def test_mechanism_cli_starts_without_torch() -> None:
    if not _imports_torch("brisk.cli.mechanism"):
        return
    if _imports_torch("brisk.theory"):
        pytest.skip("brisk.theory imports torch at import time (brisk.mechanism builds on it)")
    pytest.fail("importing brisk.cli.mechanism imports torch, brisk.theory alone does not")
