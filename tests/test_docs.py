"""Every code block of the manual (``docs/**/*.md``) runs as written.

The rule, for ``docs/`` and ``README.md`` alike (``tests/test_readme.py`` runs the README's
blocks through the same functions):

- a ```` ```python ```` block runs; the blocks of one page run in one namespace, in order, so a
  later block builds on an earlier one;
- a ```` ```bash ```` block runs when every command in it is a ``brisk`` command: each runs in
  this process through ``brisk.cli.main`` (no interpreter start-up, no second torch import) and
  must exit with 0;
- a block that must not run here (it trains for minutes, needs a GPU, a server, the network or
  another virtualenv, or installs) says so in its fence, ```` ```bash title="not run: why" ````,
  a title the rendered page shows its reader too. A bash block without that title that holds
  anything but ``brisk`` commands fails, and so does a python block with it: nothing is skipped
  silently;
- no other fence language is allowed: a config file is written by a bash heredoc or by Python.

A page's blocks, python and bash in document order, run in one fresh directory holding a micro
checkpoint (random weights, the character tokenizer) at ``runs/tiny/base/final``, where
``make tiny`` writes its base; that directory is the working directory of both.

``mkdocs build --strict`` (``make docs``, part of ``make test``) checks the pages' links and
the API pages' docstrings; this file checks what the pages say runs, and that every repository
file the README and the pages name in a code span (a summary, a script, a notebook) exists.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import textwrap
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
NOT_RUN = "not run: "
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<info>.*)$")
TITLE = re.compile(r'title="(?P<title>[^"]*)"')


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, the title in its fence (``""`` if none), its code
    (dedented to its fence) and the line its fence opens on."""

    lang: str
    title: str
    code: str
    line: int

    @property
    def runs(self) -> bool:
        return not self.title.startswith(NOT_RUN)


def code_blocks(text: str, where: str) -> Iterator[Block]:
    """The fenced blocks of a Markdown text, in order; ``where`` names it in errors."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i].rstrip("\n"))
        i += 1
        if opening is None:
            continue
        start = i
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        assert i < len(lines), f"{where}:{start}: unclosed ``` block"
        title = TITLE.search(opening["info"])
        code = textwrap.dedent("".join(lines[start:i]))
        yield Block(opening["lang"], title["title"] if title else "", code, start)
        i += 1


def brisk_commands(code: str, where: str) -> list[list[str]]:
    """The commands of a bash block, each as its argument list; every one must be ``brisk``."""
    joined = re.sub(r"\\\n", " ", code)
    commands = [shlex.split(line, comments=True) for line in joined.splitlines()]
    commands = [argv for argv in commands if argv]
    for argv in commands:
        assert argv[0] == "brisk", (
            f"{where}: `{shlex.join(argv)}` is not a brisk command; a block the tests cannot run "
            f'says why in its fence: ```bash title="{NOT_RUN}..."'
        )
    return commands


def check_block(block: Block, where: str) -> None:
    """A block follows the rule of this module's docstring."""
    assert block.lang in ("python", "bash"), f"{where}: fence language {block.lang!r}"
    assert block.title == "" or block.title.startswith(NOT_RUN), (
        f"{where}: a fence's title is {NOT_RUN!r} and why, got {block.title!r}"
    )
    assert block.lang == "bash" or block.runs, f"{where}: every python block runs"


def run_blocks(blocks: list[Block], where: str, namespace: dict[str, object]) -> int:
    """Run the blocks that run, in order; returns how many ran."""
    from brisk.cli import main

    ran = 0
    for block in blocks:
        at = f"{where}:{block.line}"
        check_block(block, at)
        if not block.runs:
            continue
        if block.lang == "python":
            exec(compile(block.code, at, "exec"), namespace)
        else:
            for argv in brisk_commands(block.code, at):
                threads = torch.get_num_threads()
                try:
                    code = main(argv[1:])
                except SystemExit as done:  # argparse's --help exits with 0
                    code = done.code if isinstance(done.code, int) else int(done.code is not None)
                finally:
                    torch.set_num_threads(threads)
                assert code == 0, f"{at}: `{shlex.join(argv)}` exited with {code}"
        ran += 1
    return ran


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro model with random weights and the character tokenizer, saved once."""
    from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    path = tmp_path_factory.mktemp("micro") / "final"
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def workdir(micro_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory with the micro checkpoint where ``make tiny`` puts its base."""
    shutil.copytree(micro_checkpoint, tmp_path / "runs" / "tiny" / "base" / "final")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path


PAGES = sorted(DOCS.rglob("*.md"))


def test_the_manual_has_pages_with_code() -> None:
    with_code = [p.name for p in PAGES if list(code_blocks(p.read_text(), p.name))]
    assert {"theory.md", "mechanism.md", "decoding.md", "training.md"} <= set(with_code)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_runs(page: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = str(page.relative_to(ROOT))
    blocks = list(code_blocks(page.read_text(), where))
    # The page runs as a module of its own, as a script would (a dataclass looks its module up).
    module = types.ModuleType(f"docs:{page.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    run_blocks(blocks, where, module.__dict__)


REPO_FILE = re.compile(
    r"`((?:benchmarks|brisk|configs|docs|notebooks|tests)/[\w./-]+\.(?:ipynb|json|md|png|py|toml))`"
)


def repository_files_named(text: str) -> list[str]:
    """The repository files a Markdown text names in code spans (``benchmarks/RESULTS.md``)."""
    return REPO_FILE.findall(text)


def test_the_files_the_manual_names_exist() -> None:
    """A summary, script or notebook the README or a page names is in the repository (the
    changelog alone names retired files)."""
    named = {
        (str(page.relative_to(ROOT)), name)
        for page in [ROOT / "README.md", *PAGES]
        for name in repository_files_named(page.read_text())
    }
    assert any(name.endswith(".json") for _, name in named)
    missing = sorted((page, name) for page, name in named if not (ROOT / name).exists())
    assert not missing, missing
    assert repository_files_named("see `benchmarks/results/nowhere.json`") == [
        "benchmarks/results/nowhere.json"
    ]


def test_a_block_that_is_not_brisk_must_say_why() -> None:
    """Negative controls: the rule refuses what it must."""
    text = '```bash\nmake tiny\n```\n```python title="not run: slow"\npass\n```\n```toml\n```\n'
    bash, python, toml = code_blocks(text, "t.md")
    with pytest.raises(AssertionError, match="not a brisk command"):
        run_blocks([bash], "t.md", {})
    with pytest.raises(AssertionError, match="every python block runs"):
        check_block(python, "t.md")
    with pytest.raises(AssertionError, match="fence language"):
        check_block(toml, "t.md")
    skipped = Block("bash", f"{NOT_RUN}trains for 20 minutes", "make tiny\n", 1)
    assert run_blocks([skipped], "t.md", {}) == 0


def test_a_failing_brisk_command_fails(workdir: Path) -> None:
    block = Block("bash", "", "brisk theory tpf --a 1.5\n", 1)
    with pytest.raises(AssertionError, match="exited with 2"):
        run_blocks([block], "t.md", {})
