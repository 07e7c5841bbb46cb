"""The code world's corpus: the Python standard library's own source, cut into documents.

The files are this interpreter's stdlib (``sysconfig.get_paths()["stdlib"]``) or any folder
(``root``), every ``*.py`` file except those under a folder named in :data:`EXCLUDED` (the test
suites, ``idlelib``, installed packages, caches). A file that does not parse under this
interpreter contributes nothing. Each top-level function and class of a file is one
:class:`Document`: its source lines (decorators included, exactly as written) behind the module's
import statements it needs, i.e. the top-level imports whose bound names it uses, each written
with those names only (``from __future__`` imports always). Encoded for training a document is
``[bos, text, eos]`` (:func:`encode_document`; ``brisk train ar`` encodes a corpus example so),
so every document ends in EOS.

**The split is by file**: a file is held out iff the first 8 hex digits of
``sha256(relative path)``, read as an integer, fall below ``heldout_fraction · 16⁸``
(:func:`split_of`), so a file's documents are all on one side and the split of a file never
depends on which other files are there. :func:`provenance` records the interpreter, the root,
the sha256 of the sorted relative file list, the rule and the counts, saved beside every
artifact built from the corpus.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import os
import platform
import sysconfig
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Literal

from brisk.runtime.configs import Config

__all__ = [
    "EXCLUDED",
    "CorpusConfig",
    "Document",
    "Function",
    "SplitFiles",
    "documented_function",
    "documents",
    "encode_document",
    "file_documents",
    "provenance",
    "python_files",
    "read_source",
    "read_split_file",
    "split_of",
    "stdlib_root",
]

Side = Literal["train", "heldout"]
EXCLUDED = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})
_SCALE = 16**8  # the split hash: 8 hex digits


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class CorpusConfig(Config):
    """Which files make the corpus and how they are split (module docstring)."""

    root: str = ""  # the folder of Python files (empty: this interpreter's stdlib)
    heldout_fraction: float = 0.05  # share of files held out, by a hash of the relative path
    max_files: int = 0  # the first files in path order only (0: all), for a micro corpus
    # fnmatch patterns of relative paths to keep (empty: every file), e.g. "json/*"
    include: tuple[str, ...] = ()
    # a JSON file {"train": [paths], "heldout": [paths]} that sets the split instead of the hash
    split_file: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction: need 0 ≤ f < 1, got {self.heldout_fraction!r}")
        if self.max_files < 0:
            raise ValueError(f"max_files: need ≥ 0 (0: all), got {self.max_files!r}")
        super().__post_init__()

    @property
    def path(self) -> Path:
        return Path(self.root) if self.root else stdlib_root()

    def side_of(self, relpath: str) -> Side | None:
        """The side of a file: by :func:`split_of`, or by the split file (None: in neither of
        its lists)."""
        if not self.split_file:
            return split_of(relpath, self.heldout_fraction)
        manifest = read_split_file(self.split_file)
        return (
            "heldout"
            if relpath in manifest.heldout
            else ("train" if relpath in manifest.train else None)
        )

    @classmethod
    def micro(cls) -> CorpusConfig:
        """For tests: the json, email, html and http packages and a few modules (≈ 40 files,
        about a second to read)."""
        return cls(include=("json/*", "email/*", "html/*", "http/*", "textwrap.py", "colorsys.py"))


def split_of(relpath: str, heldout_fraction: float) -> Side:
    """The side of a file (module docstring): a function of its relative path alone.

    >>> split_of("json/decoder.py", 0.05), split_of("json/decoder.py", 0.0)
    ('train', 'train')
    """
    h = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16)
    return "heldout" if h < heldout_fraction * _SCALE else "train"


@dataclass(frozen=True)
class SplitFiles:
    """The files of each side; a file on both is a ``ValueError`` naming it and ``where``."""

    train: frozenset[str]
    heldout: frozenset[str]
    where: str = "split"

    def __post_init__(self) -> None:
        shared = sorted(self.train & self.heldout)
        if shared:
            raise ValueError(
                f"{self.where}: the held-out split overlaps training: {shared[0]} is on both "
                f"sides ({len(shared)} files in all)"
            )


@functools.cache
def read_split_file(path: str) -> SplitFiles:
    """A split file's lists (:attr:`CorpusConfig.split_file`); errors name the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"split_file: cannot read {path} ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"split_file: {path} is not JSON ({err.msg}, line {err.lineno})") from None
    sides = data if isinstance(data, dict) else {}
    if not all(isinstance(sides.get(k), list) for k in ("train", "heldout")):
        raise ValueError(f'split_file: {path} needs "train" and "heldout" lists of paths')
    return SplitFiles(
        frozenset(map(str, sides["train"])), frozenset(map(str, sides["heldout"])), path
    )


def python_files(cfg: CorpusConfig) -> list[str]:
    """The corpus's files as sorted POSIX paths relative to the root; a root with none is a
    ``ValueError`` naming it."""
    root = cfg.path
    if not root.is_dir():
        raise ValueError(f"root: {root} is not a directory")
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED)
        rel = Path(folder).relative_to(root)
        found += [(rel / n).as_posix() for n in names if n.endswith(".py")]
    files = sorted(f for f in found if not cfg.include or any(fnmatch(f, p) for p in cfg.include))
    if cfg.max_files:
        files = files[: cfg.max_files]
    if not files:
        chosen = f" matching {', '.join(cfg.include)}" if cfg.include else ""
        raise ValueError(f"root: {root} holds no Python files{chosen}")
    return files


@dataclass(frozen=True)
class Document:
    """One top-level function or class of ``path``: ``text`` is ``imports`` then ``source``
    (its lines from the first decorator to its end, exact). As a corpus example its prompt is
    empty and its response the text."""

    path: str
    name: str
    kind: Literal["function", "class"]
    line: int  # 1-based line of its first decorator (or of def / class)
    imports: str
    source: str
    node: ast.AST = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        return self.imports + self.source

    @property
    def prompt(self) -> str:
        return ""

    @property
    def response(self) -> str:
        return self.text


@dataclass(frozen=True)
class Function:
    """A documented function of a document cut in two: ``prompt`` is the imports, decorators,
    signature and docstring, up to the end of the docstring's last line but not its line end;
    ``body`` is that line end and the lines after it. The cut is there because the code
    tokenizer joins a newline to the next line's indentation: in training a body's first token
    is ``"\\n" + indentation``, so a prompt ending in a lone newline token would ask the model to
    continue from a token it has only seen before top-level code or a document's end (it answers
    EOS). HumanEval's prompts are cut the same way (:mod:`brisk.worlds.code.humaneval`)."""

    path: str
    name: str
    prompt: str
    body: str


def _bound(alias: ast.alias, module: bool) -> str:
    """The name an import alias binds (``import a.b`` binds ``a``)."""
    if alias.asname:
        return alias.asname
    return alias.name.split(".")[0] if module else alias.name


def _render(stmt: ast.Import | ast.ImportFrom, aliases: list[ast.alias]) -> str:
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
    if isinstance(stmt, ast.Import):
        return f"import {names}\n"
    return f"from {'.' * stmt.level}{stmt.module or ''} import {names}\n"


def _imports_for(node: ast.AST, imports: list[ast.Import | ast.ImportFrom]) -> str:
    """The module's top-level imports ``node`` uses, each with the used names only."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    out = []
    for stmt in imports:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            out.append(_render(stmt, stmt.names))
            continue
        module = isinstance(stmt, ast.Import)
        keep = [a for a in stmt.names if a.name != "*" and _bound(a, module) in used]
        if keep:
            out.append(_render(stmt, keep))
    return "".join(out)


def file_documents(source: str, relpath: str) -> list[Document]:
    """The documents of one file's source (module docstring); a file that does not parse has
    none."""
    try:
        tree = ast.parse(source, relpath)
    except (SyntaxError, ValueError):
        return []
    lines = _lines(source)
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    docs = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in tree.body:
        if not isinstance(node, defs) or node.end_lineno is None:
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        text = "".join(lines[start - 1 : node.end_lineno])
        if not text.endswith("\n"):
            text += "\n"
        kind: Literal["function", "class"] = (
            "class" if isinstance(node, ast.ClassDef) else "function"
        )
        docs.append(
            Document(relpath, node.name, kind, start, _imports_for(node, imports), text, node)
        )
    return docs


def _lines(text: str) -> list[str]:
    """The lines of ``text`` as Python counts them (ends ``\\n``, ``\\r\\n``, ``\\r``; a form
    feed is no line end, unlike ``str.splitlines``), each with its end."""
    return io.StringIO(text, newline="").readlines()


def read_source(path: Path) -> str | None:
    """A file's text as Python reads it (PEP 263 encoding declared or UTF-8), None when it is
    not readable so; line ends as written."""
    try:
        with path.open("rb") as f:
            encoding, _ = tokenize.detect_encoding(f.readline)
        return path.read_bytes().decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError, OSError):
        return None


def documents(cfg: CorpusConfig, side: Side | None = None) -> Iterator[Document]:
    """Every document of the corpus's files on ``side`` (None: both), streamed file by file in
    path order."""
    root = cfg.path
    for rel in python_files(cfg):
        where = cfg.side_of(rel)
        if where is None or (side is not None and where != side):
            continue
        source = read_source(root / rel)
        if source is not None:
            yield from file_documents(source, rel)


def documented_function(doc: Document) -> Function | None:
    """The document cut at the end of its docstring (:class:`Function`), or None when it is
    not a function whose docstring ends a line with at least one statement after it."""
    node = doc.node
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or len(node.body) < 2:
        return None
    first, second = node.body[0], node.body[1]
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and first.end_lineno is not None
        and second.lineno > first.end_lineno
    ):
        return None
    cut = first.end_lineno - doc.line + 1  # lines of the source up to the docstring's end
    lines = _lines(doc.source)
    head = doc.imports + "".join(lines[:cut])
    prompt = head.rstrip("\r\n")  # the docstring's line end opens the body (Function)
    return Function(doc.path, doc.name, prompt, head[len(prompt) :] + "".join(lines[cut:]))


def encode_document(text: str, tokenizer: Any) -> list[int]:
    """``[bos, text, eos]`` token ids of a document (the BOS where the tokenizer has one)."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [*bos, *ids, tokenizer.eos_token_id]


def provenance(cfg: CorpusConfig) -> dict[str, Any]:
    """What the corpus of ``cfg`` is (module docstring), with its file and document counts per
    side; reads and parses every file (a few seconds for the whole stdlib)."""
    files = python_files(cfg)
    listing = hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest()
    counts = {s: {"files": 0, "documents": 0, "unparsed": 0} for s in ("train", "heldout")}
    for rel in files:
        side = cfg.side_of(rel)
        if side is None:
            continue
        source = read_source(cfg.path / rel)
        docs = file_documents(source, rel) if source is not None else None
        counts[side]["files"] += 1
        if source is None or (not docs and _unparsable(source, rel)):
            counts[side]["unparsed"] += 1
        counts[side]["documents"] += len(docs or [])
    return {
        "interpreter": f"{platform.python_implementation()} {platform.python_version()}",
        "root": str(cfg.path),
        "files": len(files),
        "files_sha256": listing,
        "split": (
            f"by file, as listed in {cfg.split_file}"
            if cfg.split_file
            else "by file: heldout iff int(sha256(relative path)[:8], 16) < "
            f"{cfg.heldout_fraction!r} * 16**8"
        ),
        "config": cfg.to_dict(),
        "counts": counts,
    }


def _unparsable(source: str, relpath: str) -> bool:
    try:
        ast.parse(source, relpath)
    except (SyntaxError, ValueError):
        return True
    return False
