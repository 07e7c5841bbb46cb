"""The tokenizer's and the files' side of decoding: prompt text in, completion text out, as
``brisk decode`` does.

:func:`brisk.runtime.isd.decode` works on token ids and stops only at the EOS id it is given.
A base model trained on ``[bos, prompt, response, eos]`` (the tiny world, I-DLM) decodes noise
from a prompt without its BOS and never stops without its EOS, so the Python API goes through
the same three helpers as the command line:

>>> from brisk.runtime.presets import preset_tokenizer
>>> tokenizer = preset_tokenizer("tiny")  # the tiny world's character tokenizer
>>> encode_prompts(tokenizer, ["1+2"])  # BOS (id 1) first
[[1, 23, 17, 24]]
>>> isd_options(tokenizer, stride=8).eos_token_id, isd_options(tokenizer, stride=8).M
(2, 7)
>>> completion_text(tokenizer, [23, 17, 24, 2])  # cut at EOS (id 2)
'1+2'

A prompt file is JSON Lines, one request per object ``{"prompt": str, "answer": ..., "grader":
str, "id": ...}`` (all but the prompt optional), or plain text with one prompt per line
(:func:`read_prompts`); the rows a decode writes are JSON Lines too (:func:`write_jsonl`, and
:class:`PartialRows` while it runs). Errors name the argument (``prompts: …``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from transformers import PreTrainedTokenizerBase

from brisk._atomic import atomic_write_text
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.result import DecodeResult
from brisk.runtime.tasks.graders import resolve_grader
from brisk.runtime.tasks.sources import read_json_lines, read_lines

__all__ = [
    "PartialRows",
    "check_output_file",
    "completion_text",
    "completion_texts",
    "encode_prompt",
    "encode_prompts",
    "isd_options",
    "read_prompt_lines",
    "read_prompts",
    "write_jsonl",
]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` behind the tokenizer's BOS (when it has one and the text does not
    already start with it); no other special tokens are added."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids


def encode_prompts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """:func:`encode_prompt` of each text: the ``prompts`` argument of ``decode``."""
    if isinstance(texts, str):
        raise TypeError("texts: expected a sequence of prompts, got one string")
    return [encode_prompt(tokenizer, t) for t in texts]


def isd_options(tokenizer: PreTrainedTokenizerBase, **options: Any) -> ISDOptions:
    """:class:`ISDOptions` (keyword arguments as there) that stop at the tokenizer's EOS unless
    ``eos_token_id`` is given."""
    options.setdefault("eos_token_id", tokenizer.eos_token_id)
    return ISDOptions(**options)


def completion_text(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int]) -> str:
    """The text of one request's output tokens, the EOS that ended it left out."""
    eos = tokenizer.eos_token_id
    return str(tokenizer.decode([t for t in tokens if t != eos]))


def completion_texts(tokenizer: PreTrainedTokenizerBase, result: DecodeResult) -> list[str]:
    """:func:`completion_text` of every request of a ``decode`` result, in prompt order."""
    return [completion_text(tokenizer, tokens) for tokens in result.tokens]


def read_prompts(path: Path) -> list[dict[str, Any]]:
    """Requests from ``path``; anything malformed is an error naming the file and line."""
    return [item for _, item in read_prompt_lines(path)]


def read_prompt_lines(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """:func:`read_prompts` with each request's line number in the file."""
    if not path.exists():
        raise ValueError(f"prompts: {path} does not exist")
    if not path.is_file():
        raise ValueError(f"prompts: {path} is not a file")
    try:
        if path.suffix in {".jsonl", ".json"}:
            items = read_json_lines(path)
        else:
            items = [(number, {"prompt": line}) for number, line in read_lines(path)]
    except ValueError as err:
        raise ValueError(f"prompts: {err}") from None
    for number, item in items:
        where = f"prompts: {path} line {number}"
        if "prompt" not in item:
            raise ValueError(f'{where}: no "prompt" field (keys: {", ".join(item) or "none"})')
        if "grader" in item:
            try:
                resolve_grader(item["grader"])
            except ValueError as err:
                raise ValueError(f'{where}: "grader": {err}') from None
        if not isinstance(item["prompt"], str):
            raise ValueError(f'{where}: "prompt" must be a string, got {item["prompt"]!r}')
    if not items:
        raise ValueError(f"prompts: {path} holds no prompts")
    return items


def check_output_file(path: Path, name: str) -> None:
    """Fail before any work if ``path`` cannot be written as a file (the error names ``name``,
    the caller's argument)."""
    if path.is_dir():
        raise ValueError(f"{name}: {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{name}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"{name}: directory {parent} is not writable")


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Write all rows, atomically: readers see the old file or the whole new one."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


class PartialRows:
    """Finished rows appended to ``.<name>.partial`` beside ``out``, in finish order."""

    def __init__(self, out: Path) -> None:
        self.path = out.with_name(f".{out.name}.partial")
        self.file: IO[str] | None = self.path.open("w")

    def add(self, row: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
