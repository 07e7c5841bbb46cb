"""``docs/architecture.md`` is drawn from the code as it is: its table of rooms names every
package of ``brisk/`` and every module of the packages it lists file by file, and every file it
names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `(?P<folder>brisk/[^`]*)`(?: \([^)]*\))? \| (?P<text>.*) \|$")
NAMED = re.compile(r"`([\w/.]+(?:\.py|/))`")
# The rooms whose table row names each of their modules (the others are summarized in words);
# the training room down to its recipes' packages, the others their own folder.
EVERY_MODULE = (
    "brisk/runtime/train/",
    "brisk/runtime/isd/",
    "brisk/runtime/drafter/",
    "brisk/runtime/serving/",
    "brisk/experiments/",
    "brisk/theory/",
)


def rooms() -> dict[str, str]:
    """Folder → the text of its row (a folder with two rows: both texts)."""
    found: dict[str, str] = {}
    for line in PAGE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            found[m["folder"]] = found.get(m["folder"], "") + " " + m["text"]
    return found


def named_files(folder: str, text: str) -> set[Path]:
    """The files and folders a row names, found under its folder (a name in a sub-list, e.g.
    ``data.py`` of ``proposal/``, anywhere below it)."""
    base = ROOT / folder
    paths: set[Path] = set()
    for name in NAMED.findall(text):
        hits = [base / name] if (base / name).exists() else []
        hits += list(base.rglob(name.rstrip("/")))  # e.g. evaluate.py of drafter/ too
        assert hits, f"docs/architecture.md names {name} in {folder}, which does not exist"
        paths.update(hits)
    return paths


def test_every_file_the_rooms_name_exists() -> None:
    table = rooms()
    assert "brisk/runtime/train/" in table
    for folder, text in table.items():
        named_files(folder, text)


def test_every_package_has_a_room_or_is_named_in_its_parents() -> None:
    table = rooms()
    named = {p.resolve() for folder, text in table.items() for p in named_files(folder, text)}
    rooms_at = {(ROOT / folder).resolve() for folder in table}
    placed = rooms_at | named
    broad = {(ROOT / "brisk").resolve(), (ROOT / "brisk" / "runtime").resolve()}
    missing = []
    for init in sorted((ROOT / "brisk").rglob("__init__.py")):
        package = init.parent.resolve()
        if package in broad:
            continue
        # the package, or a package it lies in below the two broad rooms, has a room or a name
        up = [package, *package.parents]
        up = up[: next(i for i, p in enumerate(up) if p in broad)]
        if not placed.intersection(up):
            missing.append(str(package.relative_to(ROOT)))
    assert not missing, f"packages docs/architecture.md does not place: {missing}"


def test_the_rooms_listed_file_by_file_name_every_module() -> None:
    table = rooms()
    for folder in EVERY_MODULE:
        named = {p.resolve() for p in named_files(folder, table[folder])}
        files = (ROOT / folder).rglob("*.py") if folder == "brisk/runtime/train/" else None
        files = files or (ROOT / folder).glob("*.py")
        modules = {p.resolve() for p in files if p.name != "__init__.py"}
        modules -= {(ROOT / folder / "__init__.py").resolve()}
        left = sorted(str(p.relative_to(ROOT)) for p in modules - named)
        assert not left, f"{folder}: docs/architecture.md does not name {left}"
