"""Every ```python block of README.md runs as written.

Blocks run in order, those of one ``##`` section in one namespace (later blocks build on
earlier ones), in a temporary directory holding a freshly built micro checkpoint at the path the
README names, ``runs/tiny/base/final``. Bash blocks are not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brisk.runtime.tiny.model import TinyModelConfig, build_model
from brisk.runtime.tiny.tokenizer import char_tokenizer

README = Path(__file__).parents[1] / "README.md"


def python_blocks(text: str) -> dict[str, list[str]]:
    """The ```python blocks of a Markdown text, grouped by their ``##`` section, in order."""
    sections: dict[str, list[str]] = {}
    section = "(preamble)"
    block: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if block is not None:
            if line.strip() == "```":
                sections.setdefault(section, []).append("".join(block))
                block = None
            else:
                block.append(line)
        elif line.startswith("## "):
            section = line[3:].strip()
        elif line.strip() == "```python":
            block = []
    assert block is None, f"README: unclosed ```python block in section {section!r}"
    return sections


SECTIONS = python_blocks(README.read_text())


def test_the_readme_has_python_blocks() -> None:
    assert {"Theory in a notebook", "Runtime"} <= set(SECTIONS)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_readme_section_runs(section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tmp_path / "runs" / "tiny" / "base" / "final"
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"README:{section}"}
    for i, source in enumerate(SECTIONS[section]):
        exec(compile(source, f"README.md [{section}, block {i + 1}]", "exec"), namespace)
