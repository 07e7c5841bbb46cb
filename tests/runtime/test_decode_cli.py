"""`brisk decode` on a saved checkpoint, and `brisk mechanism report` on the log it writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from brisk.cli import main
from brisk.mechanism import validate
from brisk.mechanism.runs import COMPLETE_CYCLES, RENEWAL, WHOLE_RUN
from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer
from tests.runtime.graders import GRADER


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
    argv = (
        f"decode --model {checkpoint} --prompts {prompts} --stride 4 --corrector {head_dir} "
        f"--shadow --temperature 1 --score-blocks --max-new-tokens 24 --log-blocks {log} "
        f"--out {out}"
    ).split()
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps at 80 columns
    assert "predicted from the in-output acceptance profile and the output lengths" in printed
    assert f"corrector: {head_dir} (shadow" in printed
    assert "answer accuracy" in printed
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6
    assert all(isinstance(r["correct"], bool) for r in rows)
    tokenizer = char_tokenizer()  # the rows' token ids: the prompt behind its BOS, the output
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    for r in rows:
        assert r["decoder"] == "isd"
        assert r["prompt_ids"] == [bos, *tokenizer.encode(r["prompt"], add_special_tokens=False)]
        assert len(r["output_ids"]) == r["tokens"] > 0
        assert tokenizer.decode([t for t in r["output_ids"] if t != eos]) == r["completion"]
        assert (r["output_ids"][-1] == eos) == (r["finished"] == "eos")
    blocks = validate(log)
    assert blocks == sum(sum(r["accept_hist"]) for r in rows)
    report_argv = ["mechanism", "report", str(log), "--out", str(report), "--bootstrap", "20"]
    assert main(report_argv) == 0  # default K' values fit the log's K = 8
    reported = " ".join(capsys.readouterr().out.split())
    summary = json.loads((report / "summary.json").read_text())
    assert summary["blocks"] == blocks
    assert summary["likelihood"]["pairs"] == blocks
    assert summary["ks"] == [4, 8]
    # one name and one value per TPF: the decode's summary, the report's table and its JSON
    tpf = summary["tpf"]
    for name, value in ((WHOLE_RUN, tpf["whole_run"]), (COMPLETE_CYCLES, tpf["complete_cycles"])):
        assert f"{name}: {value:.3f} (" in printed
        assert re.search(rf"{name} [\d,]+ tokens ÷ [\d,]+ forwards {value:.3f}", reported)
    r = tpf["renewal"]
    shown = f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
    assert f"{RENEWAL}: {shown}" in printed
    assert f"{RENEWAL} posterior median [95% CI] {shown}" in reported
    assert summary["verification"]["rule"] == "sampled"
    assert summary["verification"]["contradictions"] == 0


def test_bad_prompt_file_is_one_line_and_exit_2(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    assert main(["decode", "--model", str(checkpoint), "--prompts", str(bad)]) == 2
    assert f"{bad} line 2" in capsys.readouterr().err


def write_prompts(path: Path, n: int) -> Path:
    path.write_text(
        "".join(json.dumps({"prompt": f"Q: {a % 10}+{a % 7}=?\n"}) + "\n" for a in range(n))
    )
    return path


def test_device_dtype_and_mask_flags_reach_the_model(
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[dict[str, Any]] = []
    load = HFBackbone.from_pretrained.__func__  # type: ignore[attr-defined]

    def spy(cls: type[HFBackbone], path: Path, /, **kwargs: Any) -> HFBackbone:
        calls.append(kwargs)
        backbone: HFBackbone = load(cls, path, **kwargs)
        return backbone

    monkeypatch.setattr(HFBackbone, "from_pretrained", classmethod(spy))
    prompts, out = write_prompts(tmp_path / "p.jsonl", 3), tmp_path / "out.jsonl"
    base = (
        f"decode --model {checkpoint} --prompts {prompts} --max-new-tokens 8 --out {out}"
    ).split()
    flags = ["--device", "cpu", "--dtype", "bfloat16", "--trust-remote-code"]
    flags += ["--mask-token-id", "4"]
    assert main([*base, *flags]) == 0
    assert main(base) == 0  # defaults: float32 on the CPU, the tokenizer's <|MASK|> (id 3)
    assert calls == [
        {
            "mask_token_id": 4,
            "trust_remote_code": True,
            "dtype": torch.bfloat16,
            "device": torch.device("cpu"),
            "attention": None,
            "need_mask": True,
        },
        {
            "mask_token_id": 3,
            "trust_remote_code": False,
            "dtype": torch.float32,
            "device": torch.device("cpu"),
            "attention": None,
            "need_mask": True,
        },
    ]
    assert len(out.read_text().splitlines()) == 3


def test_progress_bar_on_a_terminal_only(
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "decode",
        "--model",
        str(checkpoint),
        "--prompts",
        str(write_prompts(tmp_path / "p.jsonl", 5)),
        "--max-new-tokens",
        "8",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "decoding" in err
    assert "5/5" in err
    assert main([*argv, "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_ctrl_c_saves_the_finished_completions_and_the_block_log(
    checkpoint: Path, tmp_path: Path
) -> None:
    """SIGINT mid-run: exit 130, one stderr line, the finished completions in --out, a valid
    block log."""
    prompts = write_prompts(tmp_path / "many.jsonl", 2000)
    out, log = tmp_path / "out.jsonl", tmp_path / "log"
    partial = tmp_path / ".out.jsonl.partial"  # completions appear here as they finish
    argv = (
        f"{sys.executable} -m brisk.cli decode --model {checkpoint} --prompts {prompts} "
        f"--max-new-tokens 16 --temperature 1 --batch-size 2 --threads 1 --out {out} "
        f"--log-blocks {log}"
    ).split()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if we ignore it
    )
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and partial.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no completion finished within 60 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(rows) < 2000
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    blocks = validate(log)
    assert lines[0] == (
        f"brisk: interrupted after {len(rows)}/2000 requests; wrote {len(rows)} completions to "
        f"{out} and {blocks} blocks to {log}"
    )
    assert not partial.exists()


def test_command_modules_import_without_torch() -> None:
    """`brisk --help` stays fast: the command modules load torch only inside their commands."""
    heavy = "{'torch', 'transformers', 'brisk.runtime.isd'}"
    imports = "import sys, brisk.cli.train, brisk.cli.decode"
    code = f"{imports}; print(sys.modules.keys() & {heavy})"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "set()"


def test_the_summary_counts_the_graders_errors(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A grader that raises on the odd answers 1, 3, 5 of five: the printed accuracy says so,
    with the first error; the same rows graded by --grader exact say nothing of errors."""
    rows = [{"prompt": f"Q: {a}+1=?\n", "answer": a + 1} for a in range(5)]
    prompts, plain = tmp_path / "graded.jsonl", tmp_path / "plain.jsonl"
    prompts.write_text("".join(json.dumps({**r, "grader": GRADER}) + "\n" for r in rows))
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["decode", "--model", str(checkpoint), "--max-new-tokens", "8"]
    assert main([*argv, "--prompts", str(prompts)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "of 5; 3 grader errors, counted wrong (first: " in printed
    assert "cannot grade answer 1" in printed
    assert main([*argv, "--prompts", str(plain), "--grader", "exact"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "answer accuracy: " in printed
    assert "grader errors" not in printed
