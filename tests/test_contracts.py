"""The layers as import-linter contracts (``.importlinter``, run by ``make test``) and no import
circle between brisk's modules, lazy imports included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of two or more
    modules (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_circles_finds_a_lazy_circle() -> None:
    """The negative control: a circle closed by a function-local import is found."""
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert circles(graph) == [["p.a", "p.b", "p.c"]]


def test_no_module_imports_itself_through_others() -> None:
    assert circles(grimp.build_graph("brisk", cache_dir=None)) == []


def lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root`` with brisk's ``.importlinter``."""
    argv = [str(LINT), str(ROOT / ".importlinter"), "--no-cache", "--no-logo"]
    argv += [a for c in contracts for a in ("--contract", c)]
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    "contract", ["world-apart", "world-on-core", "tasks-not-train", "kernels-below-modules"]
)
def test_a_forbidden_contract_holds(contract: str) -> None:
    done = lint(ROOT, contract)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    """ISD importing the command line is reported by the layers contract; the tree as it is
    has no such import."""
    shutil.copytree(
        ROOT / "brisk", tmp_path / "brisk", ignore=shutil.ignore_patterns("__pycache__")
    )
    upward = "brisk.runtime.isd.loop -> brisk.cli"
    before = lint(tmp_path, "layers").stdout
    assert "Contracts: 1 kept" in before or "Contracts: 0 kept, 1 broken" in before, before
    assert upward not in before
    loop = tmp_path / "brisk" / "runtime" / "isd" / "loop.py"
    loop.write_text(loop.read_text() + "\nimport brisk.cli  # upward, on purpose\n")
    done = lint(tmp_path, "layers")
    assert done.returncode != 0
    assert "brisk.runtime.isd is not allowed to import brisk.cli" in done.stdout, done.stdout
    assert upward in done.stdout
