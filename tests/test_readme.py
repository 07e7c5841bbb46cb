"""README.md: its code blocks run as written; and every measured figure the README and the
manual's benchmarks page show (in bold, in a table row) is what the committed summary named in
that row holds, beside the command that writes that summary.

The blocks follow the rule of :mod:`tests.test_docs` (python blocks run, ``brisk`` commands run
in this process, a block that cannot run says why in its fence); those of one ``##`` section
share a namespace and a working directory holding the micro checkpoint at
``runs/tiny/base/final``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brisk.experiments.table import paired_change
from tests.test_docs import Block, code_blocks, micro_checkpoint, run_blocks, workdir

__all__ = ["micro_checkpoint", "workdir"]  # the fixtures, shared with the manual's test

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"


def sections(text: str) -> dict[str, list[Block]]:
    """The README's code blocks grouped by their ``##`` section, in order."""
    grouped: dict[str, list[Block]] = {}
    section, start = "(preamble)", 0
    lines = text.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")] + [len(lines)]
    for end in heads:
        part = "".join(lines[start:end])
        blocks = list(code_blocks(part, f"README.md [{section}]"))
        if blocks:
            grouped[section] = blocks
        if end < len(lines):
            section, start = lines[end][3:].strip(), end
    return grouped


SECTIONS = sections(README.read_text())


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    # The two set-up commands stay named: `.ci/run` and a fresh machine run them.
    assert "make demo" in text
    assert "make test" in text
    ran = {name for name, blocks in SECTIONS.items() if any(b.runs for b in blocks)}
    assert any("theory" in name.lower() for name in ran), ran


def test_the_readme_links_to_files_a_clone_has() -> None:
    """Relative links resolve inside the repository (the manual's own links are checked by
    ``mkdocs build --strict``); a link out of it, such as the design notes a clone never had,
    fails."""
    targets = re.findall(r"\]\(([^)#\s]+)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local
    for target in local:
        path = (ROOT / target).resolve()
        assert path.is_relative_to(ROOT), f"README links outside the repository: {target}"
        assert path.exists(), f"README links to a missing file: {target}"
    assert "../" not in README.read_text(), "README names a path outside the repository"


@pytest.mark.parametrize("section", list(SECTIONS))
def test_readme_section_runs(section: str, workdir: Path) -> None:
    run_blocks(SECTIONS[section], f"README.md [{section}]", {"__name__": f"README:{section}"})


# The figures. Each is computed here from the summary JSON the README names for it; the README's
# table row shows it (formatted as below) beside that summary's path and the command writing it.


def _paired_tpf_gain(summary: dict[str, Any], arm: str, than: str) -> float:
    """The paired whole-run TPF gain of ``arm`` over ``than``: exp of the mean over seeds of the
    per-seed log-ratio, minus 1 (RESULTS' paired verdicts)."""
    evals = {(e["arm"], e["seed"]): e["tpf_run"] for e in summary["evals"]}
    seeds = summary["config"]["seeds"]
    logs = [math.log(evals[arm, s] / evals[than, s]) for s in seeds]
    return math.exp(sum(logs) / len(logs)) - 1


def _corrector_gain(summary: dict[str, Any]) -> float:
    runs = {(r["arm"], r["seed"]): r["eval"]["tpf_run"] for r in summary["runs"]}
    seeds = summary["config"]["seeds"]
    logs = [math.log(runs["distilled", s] / runs["off", s]) for s in seeds]
    return math.exp(sum(logs) / len(logs)) - 1


def _percent(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _comparison(summary: dict[str, Any], name: str) -> float:
    """A serving sweep's geometric mean over C of the paired tokens/s ratio ``name``."""
    return next(
        r["ratio"]["mean"] for r in summary["comparisons"][name] if r["concurrency"] is None
    )


def _host_share(summary: dict[str, Any], batch: str) -> float:
    timing = summary["worker"]["isd-off"]["decode_by_batch_size"][batch]
    return timing["host_ms"] / timing["model_ms"]


def _memory(summary: list[dict[str, Any]], what: str) -> float:
    return next(row["ratio"] for row in summary if row["what"] == what)


@dataclass(frozen=True)
class Figure:
    name: str
    summary: str
    command: str
    value: Callable[[Any], float]
    shown: Callable[[float], str]
    pages: tuple[str, ...] = ("README.md", "docs/benchmarks.md")


CONVERTED = "benchmarks/figures/converted_summary.json"
CORRECTOR = "benchmarks/figures/corrector_summary.json"
SERVING = "benchmarks/serve_cpu_bench.py"
MEMORY = "benchmarks/memory_bench.py"
BENCHMARKS_PAGE = ("docs/benchmarks.md",)
FIGURES = [
    Figure(
        "whole method",
        CONVERTED,
        "make reproduce-converted",
        lambda s: _paired_tpf_gain(s, s["head"]["row"], "base"),
        _percent,
    ),
    Figure(
        "self-generated over reference data",
        CONVERTED,
        "make reproduce-converted",
        lambda s: _paired_tpf_gain(s, "selfgen-all-dynamic@5ep", "reference-dynamic@5ep"),
        _percent,
    ),
    Figure(
        "proposal training alone",
        CONVERTED,
        "make reproduce-converted",
        lambda s: _paired_tpf_gain(s, "selfgen-correct-dynamic@5ep", "base"),
        _percent,
    ),
    Figure(
        "dynamic over uniform weights",
        CONVERTED,
        "make reproduce-converted",
        lambda s: _paired_tpf_gain(s, "selfgen-correct-dynamic@5ep", "selfgen-correct-uniform@5ep"),
        _percent,
    ),
    Figure(
        "corrector head on over off",
        CORRECTOR,
        "make reproduce-corrector",
        _corrector_gain,
        _percent,
    ),
    Figure(
        "rescues per 100 first breakers",
        CORRECTOR,
        "make reproduce-corrector",
        lambda s: 100 * s["mechanism"]["distilled"]["rescue"]["mean"],
        lambda x: f"{x:.1f}",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "regressions per 100 accepted positions",
        CORRECTOR,
        "make reproduce-corrector",
        lambda s: 100 * s["mechanism"]["distilled"]["regression"]["mean"],
        lambda x: f"{x:.2f}",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "CPU serving, ISD over AR",
        "benchmarks/results/serve_cpu_task.json",
        SERVING,
        lambda s: _comparison(s, "isd-off ÷ ar"),
        lambda x: f"{x:.2f}×",
    ),
    Figure(
        "CPU serving, host time at batch 8",
        "benchmarks/results/serve_cpu_task.json",
        SERVING,
        lambda s: _host_share(s, "8"),
        lambda x: f"{100 * x:.1f} %",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "CPU serving on the budget-stopped base",
        "benchmarks/results/serve_cpu_task_1013_steps.json",
        SERVING,
        lambda s: _comparison(s, "isd-off ÷ ar"),
        lambda x: f"{x:.2f}×",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "CPU serving, the reworked worker over the old",
        "benchmarks/results/serve_cpu_task_before_after.json",
        SERVING,
        lambda s: _comparison(s, "isd-after ÷ isd-before"),
        lambda x: f"{x:.3f}×",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "decode memory at V = 151,936",
        "benchmarks/results/memory.json",
        MEMORY,
        lambda s: _memory(s, "decode"),
        lambda x: f"{x:.3f}",
    ),
    Figure(
        "training-step memory at V = 151,936",
        "benchmarks/results/memory.json",
        MEMORY,
        lambda s: _memory(s, "proposal step"),
        lambda x: f"{x:.3f}",
        BENCHMARKS_PAGE,
    ),
]
CODE_WORLD = "benchmarks/results/code_world.json"
FIGURES += [
    Figure(
        "code world: held-out functions that compile",
        CODE_WORLD,
        "benchmarks/code_world.py",
        lambda s: s["decode"]["N8_T0"]["correct"] / s["decode"]["N8_T0"]["graded"],
        lambda x: f"{x:.3f}",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "code world: ISD TPF at N = 8, greedy",
        CODE_WORLD,
        "benchmarks/code_world.py",
        lambda s: s["decode"]["N8_T0"]["tpf_whole_run"],
        lambda x: f"{x:.3f}",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "code world: HumanEval pass@1",
        CODE_WORLD,
        "benchmarks/code_world.py",
        lambda s: s["humaneval"]["pass_at_1"],
        lambda x: f"{x:.3f}",
        BENCHMARKS_PAGE,
    ),
]
CODE_ABLATION = "benchmarks/results/code_ablation.json"


def _paired(summary: dict[str, object], num: str, den: str) -> float:
    evals = summary["evals"]
    assert isinstance(evals, list)
    change = paired_change({(e["arm"], e["seed"]): e["tpf_run"] for e in evals}, num, den)
    assert change is not None
    return change.mean


FIGURES += [
    Figure(
        "code world: BRISK training alone, TPF change",
        CODE_ABLATION,
        "make code-ablation",
        lambda s: _paired(s, "selfgen-correct-dynamic@2ep", "base"),
        lambda x: f"{100 * x:+.1f} %",
        BENCHMARKS_PAGE,
    ),
    Figure(
        "code world: dynamic against uniform weights, TPF change",
        CODE_ABLATION,
        "make code-ablation",
        lambda s: _paired(s, "selfgen-correct-dynamic@2ep", "selfgen-correct-uniform@2ep"),
        lambda x: f"{100 * x:+.1f} %",
        BENCHMARKS_PAGE,
    ),
]
CODE_DRAFTER = "benchmarks/results/code_drafter.json"


def _drafter_change(summary: dict[str, object], other: str) -> float:
    evals = summary["evals"]
    assert isinstance(evals, list)
    change = paired_change({(e["arm"], e["seed"]): e["tpf"] for e in evals}, "brisk", other)
    assert change is not None
    return change.mean


FIGURES += [
    Figure(
        f"code world drafter: brisk against {other}",
        CODE_DRAFTER,
        "make code-drafter",
        lambda s, other=other: _drafter_change(s, other),
        lambda x: f"{100 * x:+.1f} %",
        BENCHMARKS_PAGE,
    )
    for other in ("uniform", "decay", "dpace")
]


def _head_change(summary: dict[str, object], num: str, den: str) -> float:
    """A paired change of head-on TPF: ``(arm, "off")`` is the arm's head-off TPF."""
    evals = summary["evals"]
    assert isinstance(evals, list)
    values = {(e["arm"], e["seed"]): e["head"]["tpf"] for e in evals}
    values |= {((e["arm"], "off"), e["seed"]): e["head"]["tpf_off"] for e in evals}
    change = paired_change(values, num, den)  # type: ignore[arg-type]
    assert change is not None
    return change.mean


FIGURES += [
    Figure(
        name,
        CODE_DRAFTER,
        "make code-drafter",
        lambda s, num=num, den=den: _head_change(s, num, den),
        lambda x: f"{100 * x:+.1f} %".replace("-", "−"),
        BENCHMARKS_PAGE,
    )
    for name, num, den in (
        ("code world drafter: brisk head on against off", "brisk", ("brisk", "off")),
        ("code world drafter: uniform head on against off", "uniform", ("uniform", "off")),
        ("code world drafter: brisk against dpace, head on", "brisk", "dpace"),
    )
]
SMOLLM2 = "benchmarks/results/smollm2_speed.json"


def _speed_row(summary: dict[str, Any], method: str, category: str = "all") -> float:
    rows = summary["rows"]
    assert isinstance(rows, list)
    return float(
        next(r["speedup"] for r in rows if (r["method"], r["category"]) == (method, category))
    )


FIGURES.append(
    Figure(
        "SmolLM2: ISD before conversion against plain decoding",
        SMOLLM2,
        "benchmarks/smollm2_speed.py",
        lambda s: _speed_row(s, "isd4-nomask"),
        lambda x: f"{x:.2f}×",
        ("README.md", "docs/models.md"),
    )
)
FIGURES += [
    Figure(
        "SmolLM2 converted: ISD at N = 4 against its own plain decoding",
        "benchmarks/results/smollm2_isd.json",
        "make smollm2-isd",
        lambda s: _speed_row(s["speed"], "isd4", "stdlib"),
        lambda x: f"{x:.2f}×",
        ("README.md", "docs/models.md"),
    ),
    Figure(
        "SmolLM2 drafters: mean TPF of the BRISK-weighted drafter",
        "benchmarks/results/smollm2_drafters.json",
        "make smollm2-drafters",
        lambda s: (
            sum(e["tpf"] for e in s["evals"] if e["arm"] == "brisk")
            / sum(e["arm"] == "brisk" for e in s["evals"])
        ),
        lambda x: f"{x:.3f}",
        ("README.md", "docs/models.md"),
    ),
    Figure(
        "SmolLM2 converted: served ISD over AR",
        "benchmarks/results/smollm2_serve_isd.json",
        SERVING,
        lambda s: _comparison(s, "isd-off ÷ ar"),
        lambda x: f"{x:.2f}×",
        ("README.md", "docs/models.md"),
    ),
    Figure(
        "SmolLM2: served drafter over AR",
        "benchmarks/results/smollm2_serve_sd.json",
        SERVING,
        lambda s: _comparison(s, "sd ÷ ar"),
        lambda x: f"{x:.2f}×",
        ("README.md", "docs/models.md"),
    ),
]
CLAIMS = [(page, f) for f in FIGURES for page in f.pages]


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def shows(rows: list[str], figure: Figure) -> bool:
    shown = figure.shown(figure.value(json.loads((ROOT / figure.summary).read_text())))
    return any(
        f"**{shown}**" in row and figure.summary in row and figure.command in row for row in rows
    )


@pytest.mark.parametrize(("page", "figure"), CLAIMS, ids=[f"{p}: {f.name}" for p, f in CLAIMS])
def test_a_figure_is_its_summarys(page: str, figure: Figure) -> None:
    assert shows(table_rows((ROOT / page).read_text()), figure), (
        f"{page}: no table row shows the {figure.name} as **…** with {figure.summary} and "
        f"`{figure.command}`"
    )


def test_a_figure_that_is_not_its_summarys_is_found() -> None:
    """Negative control: a row whose figure differs from its summary's is not accepted."""
    whole = FIGURES[0]
    row = f"| whole method | **+43.4 %** | {whole.summary} | `{whole.command}` |"
    assert not shows([row], whole)
    value = whole.value(json.loads((ROOT / whole.summary).read_text()))
    assert shows([row.replace("+43.4 %", _percent(value))], whole)
