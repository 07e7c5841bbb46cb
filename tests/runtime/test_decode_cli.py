"""`brisk decode` on a saved checkpoint, and `brisk mechanism report` on the log it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.cli import main
from brisk.mechanism.io import validate
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.tiny.model import TinyModelConfig, build_model
from brisk.runtime.tiny.tokenizer import char_tokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_decode_logs_blocks_that_the_report_reads(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Q: {a}+{a}=?\n", "answer": 2 * a}) + "\n" for a in range(6))
    )
    head_dir = tmp_path / "head"
    Corrector(CorrectorConfig.small(64, len(char_tokenizer()), M=3, K=8)).save_pretrained(head_dir)
    log, out, report = tmp_path / "log", tmp_path / "out.jsonl", tmp_path / "report"
    argv = ["decode", "--model", str(checkpoint), "--prompts", str(prompts), "--stride", "4",
            "--corrector", str(head_dir), "--shadow", "--temperature", "1", "--score-blocks",
            "--max-new-tokens", "24", "--log-blocks", str(log), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "TPF measured" in printed
    assert "answer accuracy" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6
    assert all(isinstance(r["correct"], bool) for r in rows)
    blocks = validate(log)
    assert blocks == sum(sum(r["accept_hist"]) for r in rows)
    report_argv = ["mechanism", "report", str(log), "--out", str(report), "--bootstrap", "20"]
    assert main(report_argv) == 0  # default K' values fit the log's K = 8
    summary = json.loads((report / "summary.json").read_text())
    assert summary["blocks"] == blocks
    assert summary["likelihood"]["pairs"] == blocks
    assert summary["ks"] == [4, 8]


def test_bad_prompt_file_is_one_line_and_exit_2(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    assert main(["decode", "--model", str(checkpoint), "--prompts", str(bad)]) == 2
    assert f"{bad} line 2" in capsys.readouterr().err
