"""Every kind of file brisk reads, truncated, garbage and of the wrong schema: one line on stderr
naming the file (``brisk: error: ...``), exit 2, no traceback, nothing written.

One table, :data:`FILES`: a kind of file, how a good one is made, the command that reads it and
which file of it to damage. Every kind gets the three damages of :data:`DAMAGES` (and its own
wrong-schema content), so a kind added to the table is tested each way; a kind brisk reads that
is missing from the table is a gap in this test. Each good file is first read successfully by
the same command, so the refusal is the damage's, not the setup's. The model weights and the
corrector's damages beyond these (wrong shapes, missing tensors) are
``test_checkpoint_files.py``'s; GGUF's writer-made variants ``test_gguf.py``'s.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from brisk.cli import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class Kind:
    """A kind of file: ``relative`` names the file to damage inside the copy of ``source`` (the
    copy itself when empty), ``argv`` the command reading the copy, ``schema`` what is written as
    a well-formed file of the wrong schema (bytes)."""

    source: str  # a key of the ``goods`` fixture
    relative: str
    argv: Callable[[dict[str, Path], Path, Path], list[str]]
    schema: bytes


def _parquet(columns: dict[str, list[object]]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return bytes(sink.getvalue().to_pybytes())


WRONG_TABLE = _parquet({"x": [1, 2, 3]})


def decode(prompts: Path, out: Path, *flags: str) -> list[str]:
    base = ["decode", "--prompts", str(prompts), "--max-new-tokens", "4", "--no-progress"]
    return [*base, "--out", str(out / "out.jsonl"), *flags]


def train_corrector(events: Path, out: Path) -> list[str]:
    flags = ["--epochs", "1", "--no-only-correct", "--no-progress"]
    return ["train", "corrector", "--events", str(events), "--out", str(out / "run"), *flags]


def train_drafter(g: dict[str, Path], dataset: Path, out: Path) -> list[str]:
    flags = ["--token-budget", "20", "--batch-size", "2", "--eval-problems", "0"]
    flags += ["--data", "selfgen-all", "--target-layer-ids", "0", "--block-size", "4"]
    target = ["--target", str(g["base"]), "--dataset", str(dataset)]
    return ["train", "drafter", *target, "--out", str(out / "run"), *flags, "--no-progress"]


FILES: dict[str, Kind] = {
    "model config.json": Kind(
        "model", "config.json", lambda g, c, o: decode(g["prompts"], o, "--model", str(c)), b"[1]"
    ),
    "model weights": Kind(
        "model",
        "model.safetensors",
        lambda g, c, o: decode(g["prompts"], o, "--model", str(c)),
        b'{"__metadata__": {"format": "pt"}}',
    ),
    "tokenizer.json": Kind(
        "model", "tokenizer.json", lambda g, c, o: decode(g["prompts"], o, "--model", str(c)), b"{}"
    ),
    "prompts file": Kind(
        "prompts",
        "",
        lambda g, c, o: decode(c, o, "--model", str(g["model"])),
        b'{"question": "no prompt field"}\n',
    ),
    "drafter config.json": Kind(
        "drafter",
        "config.json",
        lambda g, c, o: decode(g["prompts"], o, "--model", str(g["target"]), "--drafter", str(c)),
        b'{"architectures": ["LlamaForCausalLM"]}',
    ),
    "drafter weights": Kind(
        "drafter",
        "model.safetensors",
        lambda g, c, o: decode(g["prompts"], o, "--model", str(g["target"]), "--drafter", str(c)),
        b'{"__metadata__": {"format": "pt"}}',
    ),
    "corrector config.json": Kind(
        "corrector",
        "config.json",
        lambda g, c, o: decode(
            g["prompts"], o, "--model", str(g["model"]), "--stride", "4", "--corrector", str(c)
        ),
        b'{"M": "three"}',
    ),
    "block-log part": Kind(
        "log",
        "part-000000.parquet",
        lambda g, c, o: ["mechanism", "report", str(c), "--out", str(o / "report")],
        WRONG_TABLE,
    ),
    "block-log request table": Kind(
        "log",
        "requests-000000.parquet",
        lambda g, c, o: ["mechanism", "report", str(c), "--out", str(o / "report")],
        WRONG_TABLE,
    ),
    "event-store metadata": Kind(
        "events", "_events.json", lambda g, c, o: train_corrector(c, o), b"[]"
    ),
    "event-store blocks": Kind(
        "events", "blocks/part-000000.parquet", lambda g, c, o: train_corrector(c, o), WRONG_TABLE
    ),
    "event-store features": Kind(
        "events", "features/keys.bin", lambda g, c, o: train_corrector(c, o), b"\x00" * 7
    ),
    "self-generated dataset part": Kind(
        "dataset", "part-00000.parquet", lambda g, c, o: train_drafter(g, c, o), WRONG_TABLE
    ),
    "self-generated dataset provenance": Kind(
        "dataset", "_provenance.json", lambda g, c, o: train_drafter(g, c, o), b'{"format": 1}'
    ),
    "TOML config": Kind(
        "config",
        "",
        lambda g, c, o: ["train", "base", "--config", str(c), "--out", str(o / "run")],
        b"[model]\nwidth = 'wide'\n",
    ),
    "GGUF file": Kind(
        "gguf",
        "",
        lambda g, c, o: ["convert", "gguf", str(c), str(o / "converted")],
        b"GGUF\x03\x00\x00\x00" + b"\x00" * 16,
    ),
}


def truncated(file: Path, schema: bytes) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def garbage(file: Path, schema: bytes) -> None:
    file.write_bytes(b"\x00\xff garbage, not this kind of file \x89\x00" * 20)


def wrong_schema(file: Path, schema: bytes) -> None:
    file.write_bytes(schema)


DAMAGES = {"truncated": truncated, "garbage": garbage, "wrong-schema": wrong_schema}


@pytest.fixture(scope="module")
def goods(
    micro_base: Path, micro_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A good file of every kind: a micro model and its prompts, a corrector for it, a block log
    of its decoding, a TOML config, a micro Llama target and a drafter for it, a tiny GGUF, the
    micro I-DLM base with its self-generated dataset and an event store of its decoding."""
    from brisk.runtime.corrector import Corrector, CorrectorConfig
    from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer
    from tests.llama_micro import llama_without_mask
    from tests.runtime.test_decode_drafter import make_drafter
    from tests.runtime.tiny_gguf import write_gguf

    root = tmp_path_factory.mktemp("goods")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    Corrector(CorrectorConfig.small(64, len(tokenizer), M=3, K=8)).save_pretrained(
        root / "corrector"
    )
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Q: {a}+1=?\n"}) + "\n" for a in range(3)))
    log = root / "log"
    argv = ["decode", "--model", str(root / "model"), "--prompts", str(prompts), "--stride", "4"]
    assert main([*argv, "--max-new-tokens", "8", "--log-blocks", str(log), "--no-progress"]) == 0
    config = root / "base.toml"
    config.write_text("steps = 1\nbatch_size = 2\nfinal_eval_problems = 0\neval_problems = 0\n")
    target = llama_without_mask(root / "target")
    from transformers import AutoConfig

    drafter = make_drafter(AutoConfig.from_pretrained(target), root / "drafter")
    gguf = root / "tiny.gguf"
    write_gguf(gguf)
    events = root / "events"
    collect = ["train", "corrector", "collect", "--checkpoint", str(micro_base), "--out"]
    flags = ["--problems", "3", "--samples", "1", "--max-new-tokens", "8", "--stride", "4"]
    assert main([*collect, str(events), *flags, "--no-progress"]) == 0
    return {
        "base": micro_base,
        "dataset": micro_dataset,
        "events": events,
        "model": root / "model",
        "prompts": prompts,
        "corrector": root / "corrector",
        "log": log,
        "config": config,
        "target": target,
        "drafter": drafter,
        "gguf": gguf,
    }


def _copy(goods: dict[str, Path], kind: Kind, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the kind's good source under ``tmp_path``, and the file in it to damage."""
    source = goods[kind.source]
    copy = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, copy)
    else:
        shutil.copy(source, copy)
    return copy, copy / kind.relative if kind.relative else copy


@pytest.mark.parametrize("name", FILES)
def test_the_good_file_of_each_kind_is_read(
    name: str, goods: dict[str, Path], tmp_path: Path
) -> None:
    kind = FILES[name]
    copy, _ = _copy(goods, kind, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert main(kind.argv(goods, copy, out)) == 0


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_a_damaged_file_is_one_line_naming_it(
    name: str,
    damage: str,
    goods: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kind = FILES[name]
    copy, file = _copy(goods, kind, tmp_path)
    DAMAGES[damage](file, kind.schema)
    out = tmp_path / "out"
    out.mkdir()
    capsys.readouterr()
    code = main(kind.argv(goods, copy, out))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("brisk: error: "), lines[0]
    assert file.name in lines[0] or str(copy) in lines[0], lines[0]
    assert list(out.iterdir()) == [], "something was written"
