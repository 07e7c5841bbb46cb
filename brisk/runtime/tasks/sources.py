"""Where a task's problems come from: a local file or dataset, a field mapping, a selection.

Formats (``kind``, inferred from the path when ``"auto"``):

- ``jsonl`` — one JSON object per line (``.jsonl``, ``.json`` lines, ``.jsonl.gz``);
- ``parquet`` — a ``.parquet`` file, or a directory of them (read in name order);
- ``csv`` — a ``.csv`` file with a header row;
- ``hf-disk`` — a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a
  ``DatasetDict``, whose ``split`` is then required when it has more than one);
- ``hf`` — a local directory that ``datasets.load_dataset`` reads (data files in the layout of a
  dataset repository), offline.

``fields`` maps the task's roles to columns, e.g. ``{"prompt": "question", "answer": "answer"}``
(GSM8K) or ``{"prompt": "problem", "answer": "solution"}`` (MATH); ``prompt`` is required, the
other roles are whatever the format and grader read. A selection takes rows ``start:stop`` and
then, with ``sample``, that many of them drawn without replacement with ``seed`` (kept in file
order). Every error names the file, and the line or the field with the fields there are.
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from brisk._json import parse_json_object

__all__ = ["KINDS", "Source", "read_json_lines", "read_lines", "read_records"]

Kind = Literal["auto", "jsonl", "parquet", "csv", "hf-disk", "hf"]
KINDS: tuple[str, ...] = ("auto", "jsonl", "parquet", "csv", "hf-disk", "hf")


@dataclass(frozen=True)
class Source:
    """A local source of problems (module docstring)."""

    path: str
    fields: Mapping[str, str] = field(default_factory=lambda: {"prompt": "prompt"})
    kind: Kind = "auto"
    split: str | None = None
    start: int = 0
    stop: int | None = None
    sample: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: need one of {', '.join(KINDS)}, got {self.kind!r}")
        if "prompt" not in self.fields:
            raise ValueError(f"fields: need a 'prompt' field, got {dict(self.fields)}")
        if self.start < 0 or (self.stop is not None and self.stop < self.start):
            raise ValueError(f"start, stop: need 0 ≤ start ≤ stop, got {self.start}, {self.stop}")
        if self.sample is not None and self.sample < 1:
            raise ValueError(f"sample: need a number of rows ≥ 1, got {self.sample}")

    def resolved_kind(self) -> str:
        """The format the path is read as."""
        if self.kind != "auto":
            return self.kind
        path = Path(self.path)
        if path.is_dir():
            if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
                return "hf-disk"
            if any(path.glob("*.parquet")):
                return "parquet"
            return "hf"
        name = path.name.lower().removesuffix(".gz")
        for suffix, kind in (
            (".jsonl", "jsonl"),
            (".json", "jsonl"),
            (".parquet", "parquet"),
            (".csv", "csv"),
        ):
            if name.endswith(suffix):
                return kind
        raise ValueError(
            f"path: cannot tell the format of {path} from its name; set the kind "
            f"({', '.join(KINDS[1:])})"
        )


def read_records(source: Source) -> list[dict[str, Any]]:
    """The selected rows, each a dict of the task's roles (``source.fields``' keys) to values,
    plus ``"_row"``: the row's index in the whole source."""
    path = Path(source.path)
    if not path.exists():
        raise ValueError(f"path: {path} does not exist")
    kind = source.resolved_kind()
    rows, columns = _READERS[kind](path, source)
    missing = [(role, col) for role, col in source.fields.items() if col not in columns]
    if missing:
        role, col = missing[0]
        have = ", ".join(map(str, columns)) or "none"
        raise ValueError(f"fields: {role} = {col!r} is not a field of {path} (fields: {have})")
    index = list(range(len(rows)))[source.start : source.stop]
    if source.sample is not None:
        if source.sample > len(index):
            raise ValueError(
                f"sample: {source.sample} rows asked, the selection of {path} has {len(index)}"
            )
        rng = np.random.default_rng(source.seed)
        index = sorted(int(i) for i in rng.choice(index, size=source.sample, replace=False))
    if not index:
        raise ValueError(
            f"start, stop: rows {source.start}:{source.stop} of {path} select nothing "
            f"({len(rows)} rows)"
        )
    return [{**{r: rows[i][c] for r, c in source.fields.items()}, "_row": i} for i in index]


Rows = tuple[list[Mapping[str, Any]], list[str]]


def read_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a UTF-8 text file (``.gz`` decompressed,
    a byte-order mark and ``\\r`` line ends dropped); undecodable bytes are a ``ValueError``
    naming the file and line."""
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: not a readable gzip file ({err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        number = data.count(b"\n", 0, err.start) + 1
        detail = f"not UTF-8 text (byte 0x{data[err.start]:02x})"
        raise ValueError(f"{path} line {number}: {detail}") from None
    lines = enumerate(text.removeprefix("\ufeff").split("\n"), 1)
    return [(n, line.removesuffix("\r")) for n, line in lines if line.strip()]


def read_json_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every JSON-lines record; a line that is not a JSON object is a
    ``ValueError`` naming the file, line and column."""
    records = []
    for number, line in read_lines(path):
        records.append((number, parse_json_object(line, f"{path} line {number}")))
    return records


def _jsonl(path: Path, source: Source) -> Rows:
    try:
        records = read_json_lines(path)
    except ValueError as err:
        raise ValueError(f"path: {err}") from None
    columns = dict.fromkeys(key for _, item in records for key in item)
    for number, row in records:  # JSON lines may differ in their keys
        absent = [(role, col) for role, col in source.fields.items() if col not in row]
        if absent and all(col in columns for _, col in absent):
            role, col = absent[0]
            raise ValueError(
                f"fields: {role} = {col!r} is missing at {path} line {number} "
                f"(fields there: {', '.join(row) or 'none'})"
            )
    return [item for _, item in records], list(columns)


def _csv(path: Path, source: Source) -> Rows:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows: list[Mapping[str, Any]] = list(reader)
            return rows, list(reader.fieldnames or [])
    except (UnicodeDecodeError, csv.Error, OSError) as err:
        raise ValueError(f"path: {path} is not a readable CSV file ({err})") from None


def _parquet(path: Path, source: Source) -> Rows:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    rows: list[Mapping[str, Any]] = []
    columns: list[str] = []
    for file in files:
        try:
            table = pq.read_table(file)
        except (pa.ArrowException, OSError) as err:
            detail = " ".join(str(err).split())
            raise ValueError(f"path: {file} is not a readable Parquet file ({detail})") from None
        columns = columns or table.column_names
        rows += table.to_pylist()
    return rows, columns


def _hf_disk(path: Path, source: Source) -> Rows:
    import datasets  # type: ignore[import-untyped]

    data = datasets.load_from_disk(str(path))
    return _rows_of(_split_of(data, source, path))


def _hf(path: Path, source: Source) -> Rows:
    import datasets

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only, never the hub
    try:
        data = datasets.load_dataset(str(path))
    except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as err:
        detail = " ".join(str(err).split())
        raise ValueError(f"path: datasets cannot load {path} ({detail})") from None
    return _rows_of(_split_of(data, source, path))


def _split_of(data: Any, source: Source, path: Path) -> Any:
    import datasets

    if not isinstance(data, datasets.DatasetDict):
        if source.split is not None:
            raise ValueError(f"split: {path} holds one dataset, not splits ({source.split!r})")
        return data
    splits = list(data)
    if source.split is None:
        if len(splits) == 1:
            return data[splits[0]]
        raise ValueError(f"split: {path} has splits {', '.join(splits)}; choose one")
    if source.split not in data:
        raise ValueError(f"split: {path} has no split {source.split!r} ({', '.join(splits)})")
    return data[source.split]


def _rows_of(dataset: Any) -> Rows:
    return list(dataset), list(dataset.column_names)


_READERS = {"jsonl": _jsonl, "csv": _csv, "parquet": _parquet, "hf-disk": _hf_disk, "hf": _hf}
