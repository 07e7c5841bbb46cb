"""Unreadable model and corrector files end in one line naming the file and what is wrong
(exit 2), before anything is decoded: truncated, not safetensors, wrong shapes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from brisk.cli import main
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(model, corrector, prompts) that decode fine."""
    root = tmp_path_factory.mktemp("good")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    Corrector(CorrectorConfig.small(64, len(tokenizer), M=3, K=8)).save_pretrained(root / "head")
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "Q: 1+1=?\n"}) + "\n")
    return root / "model", root / "head", root / "prompts.jsonl"


def truncate(file: Path) -> str:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return "not a readable safetensors file"


def garbage(file: Path) -> str:
    file.write_bytes(b"PK\x03\x04 this is a zip, not safetensors" * 50)
    return "not a readable safetensors file"


def reshape_one(file: Path) -> str:
    tensors = load_file(file)
    name = sorted(tensors)[-1]
    tensors[name] = torch.zeros(3, 5)
    save_file(tensors, file, metadata={"format": "pt"})
    return f"tensor '{name}' has shape [3, 5], the config needs"


def drop_one(file: Path) -> str:
    tensors = load_file(file)
    name = sorted(tensors)[0]
    del tensors[name]
    save_file(tensors, file, metadata={"format": "pt"})
    return f"no tensor '{name}'"


def add_one(file: Path) -> str:
    tensors = load_file(file)
    save_file({**tensors, "extra.weight": torch.zeros(2)}, file, metadata={"format": "pt"})
    return "tensor 'extra.weight' is not part of a corrector"


DAMAGE = [
    pytest.param(truncate, id="truncated"),
    pytest.param(garbage, id="not-safetensors"),
    pytest.param(reshape_one, id="wrong-shape"),
]


def decode_fails(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_model_is_one_line(
    good: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], str],
) -> None:
    model, _, prompts = good
    bad = tmp_path / "model"
    shutil.copytree(model, bad)
    words = damage(bad / WEIGHTS)
    argv = ["decode", "--model", str(bad), "--prompts", str(prompts), "--max-new-tokens", "8"]
    decode_fails(argv, capsys, "--model:", str(bad / WEIGHTS), words)


@pytest.mark.parametrize(
    "damage", [*DAMAGE, pytest.param(drop_one, id="missing"), pytest.param(add_one, id="extra")]
)
def test_a_damaged_corrector_is_one_line(
    good: tuple[Path, Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], str],
) -> None:
    model, head, prompts = good
    bad = tmp_path / "head"
    shutil.copytree(head, bad)
    words = damage(bad / WEIGHTS)
    argv = (
        f"decode --model {model} --prompts {prompts} --stride 4 --corrector {bad} "
        f"--max-new-tokens 8"
    ).split()
    decode_fails(argv, capsys, "--corrector:", str(bad / WEIGHTS), words)


def test_a_corrupt_corrector_config_is_one_line(
    good: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, head, prompts = good
    bad = tmp_path / "head"
    shutil.copytree(head, bad)
    (bad / "config.json").write_text('{"format": ')
    argv = (f"decode --model {model} --prompts {prompts} --stride 4 --corrector {bad}").split()
    decode_fails(argv, capsys, "--corrector:", str(bad / "config.json"), "not readable JSON")


def test_the_good_files_decode(
    good: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model, head, prompts = good
    argv = (
        f"decode --model {model} --prompts {prompts} --stride 4 --corrector {head} "
        f"--max-new-tokens 8"
    ).split()
    assert main(argv) == 0
