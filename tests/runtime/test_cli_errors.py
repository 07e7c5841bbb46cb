"""Bad input to ``brisk decode`` and ``brisk train``: one line on stderr naming the argument
(and file and line), exit code 2, and nothing decoded or trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.cli import main
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer
from tests.runtime.conftest import tokenizer_without_mask


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained micro model (128 positions, 100 tokens) with the character tokenizer."""
    path = tmp_path_factory.mktemp("model")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Q: {a}+1=?\n"}) + "\n" for a in range(3)))
    return path


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *names: str) -> str:
    """Run the command; assert exit code 2 and one stderr line holding every name."""
    capsys.readouterr()  # drop what the test's own setup printed
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("brisk: error: "), lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    assert captured.out == ""
    return lines[0]


def decode_argv(checkpoint: Path, prompts: Path, *extra: str) -> list[str]:
    return ["decode", "--model", str(checkpoint), "--prompts", str(prompts), *extra]


# -- brisk decode: the model and the options


def test_missing_model_directory(prompts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(decode_argv(Path("/nope"), prompts), capsys, "--model", "/nope")
    assert "not a checkpoint directory" in line


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        pytest.param(["--top-k", "-5"], "--top-k", id="top-k-negative"),
        pytest.param(["--top-k", "0", "--temperature", "1"], "--top-k", id="top-k-0-sampled"),
        pytest.param(["--batch-size", "0"], "--batch-size", id="batch-size-0"),
        pytest.param(["--samples", "0"], "--samples", id="samples-0"),
        pytest.param(["--stride", "0"], "--stride", id="stride-0"),
        pytest.param(["--stride", "1"], "--stride", id="stride-1"),
        pytest.param(["--temperature", "-1"], "--temperature", id="temperature-negative"),
        pytest.param(["--temperature", "nan"], "--temperature", id="temperature-nan"),
        pytest.param(["--max-new-tokens", "0"], "--max-new-tokens", id="max-new-tokens-0"),
        pytest.param(["--threads", "0"], "--threads", id="threads-0"),
        pytest.param(["--device", "gpu"], "--device", id="device-unknown"),
        pytest.param(["--mask-token-id", "100000"], "--mask-token-id", id="mask-id-outside"),
        pytest.param(["--shadow"], "--shadow", id="shadow-without-corrector"),
    ],
)
def test_bad_option(
    checkpoint: Path,
    prompts: Path,
    extra: list[str],
    flag: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    one_line_error(decode_argv(checkpoint, prompts, *extra), capsys, flag)


def test_top_k_0_says_why(
    checkpoint: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--top-k", "0", "--temperature", "1")
    assert "does not mean 'no limit'" in one_line_error(argv, capsys, "--top-k")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_device_without_cuda(
    checkpoint: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--device", "cuda:1")
    assert "not available" in one_line_error(argv, capsys, "--device", "cuda:1")


def test_stride_beyond_the_model_positions(
    checkpoint: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--stride", "100", "--max-new-tokens", "8")
    assert "128 positions" in one_line_error(argv, capsys, "--stride", "2M = 198")


def test_token_budget_beyond_the_model_positions(
    checkpoint: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--max-new-tokens", "200")
    line = one_line_error(argv, capsys, "--max-new-tokens", "128 positions")
    assert "at most 112 new tokens fit" in line  # 128 − 10 prompt tokens − 2M = 6


def test_the_default_budget_fits_each_prompt(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --max-new-tokens on a 128-position model: 256 would not fit, so each prompt decodes
    what fits after it (a long prompt does not cut the short ones' budgets), said in one line on
    stderr."""
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    texts = ["Q: 1+1=?\n", "Q: " + "+".join(["1"] * 30) + "=?\n", "Q: 2+1=?\n"]
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    assert main([*decode_argv(checkpoint, prompts), "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "brisk: 3 of 3 prompts decode fewer than 256 new tokens, what fits the model's 128 "
        f"positions after each and 2M = 6 (the longest, {prompts} line 2: 66 tokens, at most 56; "
        "--max-new-tokens sets one budget for all)"
    ]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    budgets = [128 - 10 - 6, 56, 128 - 10 - 6]
    for row, budget in zip(rows, budgets, strict=True):
        assert row["tokens"] <= budget
        assert row["finished"] == "eos" or row["tokens"] == budget
    assert max(r["tokens"] for r in rows) > 56, "a short prompt kept more than the long one's fit"


def test_checkpoint_without_a_mask_token(
    tmp_path: Path, prompts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = tokenizer_without_mask()
    model_dir = tmp_path / "no-mask"
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    argv = decode_argv(model_dir, prompts)
    assert "defines no MASK token" in one_line_error(argv, capsys, "--mask-token-id")


def test_corrector_for_another_stride(
    checkpoint: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = tmp_path / "head"
    Corrector(CorrectorConfig.small(64, len(char_tokenizer()), M=3)).save_pretrained(head)
    argv = decode_argv(checkpoint, prompts, "--corrector", str(head), "--stride", "8")
    assert "stride N = 4" in one_line_error(argv, capsys, "--stride", str(head))


def test_corrector_not_saved(
    checkpoint: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--corrector", str(tmp_path))
    one_line_error(argv, capsys, "--corrector", "not a saved corrector")


# -- brisk decode: files


def test_prompts_not_utf8(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    line = one_line_error(decode_argv(checkpoint, bad), capsys, "--prompts", f"{bad} line 2")
    assert "not UTF-8" in line


def test_prompts_malformed_json_line(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n\n{"prompt": \n')
    one_line_error(decode_argv(checkpoint, bad), capsys, "--prompts", f"{bad} line 3")


def test_prompts_without_prompt_field(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "fields.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"question": "1+1", "answer": 2}\n')
    line = one_line_error(decode_argv(checkpoint, bad), capsys, "--prompts", f"{bad} line 2")
    assert 'no "prompt" field' in line


def test_prompts_missing(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.jsonl"
    one_line_error(decode_argv(checkpoint, missing), capsys, "--prompts", str(missing))


def test_out_in_a_missing_directory(
    checkpoint: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "out.jsonl"
    argv = decode_argv(checkpoint, prompts, "--out", str(out))
    assert "does not exist" in one_line_error(argv, capsys, "--out", str(out.parent))


def test_out_is_a_directory(
    checkpoint: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--out", str(tmp_path))
    assert "is a directory" in one_line_error(argv, capsys, "--out", str(tmp_path))


def test_log_blocks_not_empty(
    checkpoint: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = decode_argv(checkpoint, prompts, "--log-blocks", str(tmp_path))  # holds prompts
    one_line_error(argv, capsys, "--log-blocks", "not an empty directory")


def test_problems_n_0(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "decode",
        "problems",
        "--checkpoint",
        str(checkpoint),
        "--n",
        "0",
        "--out",
        str(tmp_path / "p.jsonl"),
    ]
    one_line_error(argv, capsys, "--n", "≥ 1")


# -- brisk train base --config


def train_config(tmp_path: Path, text: str, name: str = "c.toml") -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return ["train", "base", "--config", str(path), "--out", str(tmp_path / "run")]


def test_config_broken_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = train_config(tmp_path, "steps = 10\nlr 0.1\n")
    line = one_line_error(argv, capsys, "--config", str(tmp_path / "c.toml"), "invalid TOML")
    assert "line 2" in line


def test_config_broken_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = train_config(tmp_path, '{"steps": 10,\n "lr": }\n', name="c.json")
    one_line_error(argv, capsys, "--config", "invalid JSON", "line 2")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param('steps = "ten"\n', ["steps", "expected an integer", "'ten'"], id="steps-str"),
        pytest.param("steps = 1.5\n", ["steps", "expected an integer", "1.5"], id="steps-float"),
        pytest.param("steps = true\n", ["steps", "expected an integer"], id="steps-bool"),
        pytest.param('lr = "fast"\n', ["lr", "expected a number"], id="lr-str"),
        pytest.param("strides = [2, 4.5]\n", ["strides", "a list of integers"], id="strides"),
        pytest.param('alpha = "always"\n', ["alpha", "a number or 'auto'"], id="alpha"),
        pytest.param("[model]\nlayers = 2.0\n", ["model.layers", "an integer"], id="nested"),
        pytest.param("task = 3\n", ["task", "a table of settings"], id="table"),
        pytest.param("stepz = 10\n", ["stepz", "unknown setting"], id="unknown-key"),
        pytest.param("[task]\nops = 5\n", ["task.ops", "a string"], id="nested-str"),
        pytest.param("lr = -0.1\n", ["lr", "must be > 0"], id="lr-negative"),
        pytest.param("steps = 0\n", ["steps", "must be ≥ 1"], id="steps-0"),
        pytest.param("[task]\nmin_operands = 1\n", ["task", "min_operands"], id="nested-range"),
    ],
)
def test_config_bad_value(
    tmp_path: Path, text: str, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(
        train_config(tmp_path, text), capsys, "--config", str(tmp_path / "c.toml"), *names
    )


def test_config_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.toml"
    argv = ["train", "base", "--config", str(missing)]
    assert "cannot read" in one_line_error(argv, capsys, "--config", str(missing))


def test_train_steps_flag_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*train_config(tmp_path, "steps = 10\n"), "--steps", "0"]
    one_line_error(argv, capsys, "--steps")


# -- argparse's own checks (type, choices, missing values) are one line as well


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["decode", "--top-k", "abc"], "--top-k"),
        (["decode", "--batch-size", "1.5"], "--batch-size"),
        (["decode", "--dtype", "float8"], "--dtype"),
        (["decode", "problems", "--n", "many"], "--n"),
        (["train", "base", "--config"], "--config"),
        (["mechanism", "report", "log", "--bootstrap", "x"], "--bootstrap"),
    ],
    ids=["decode-type", "decode-int", "decode-choice", "problems-type", "train-missing", "mech"],
)
def test_parser_errors_are_one_line(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one_line_error(argv, capsys, name)


def test_serve_without_sglang_says_where_to_run_it(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """brisk serve in an environment without SGLang (this one): one line, exit 2."""
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("the error path of an environment without SGLang")
    line = one_line_error(
        ["serve", "--model", str(checkpoint), "--port", "30999"], capsys, "SGLang is not installed"
    )
    assert ".venv-serving/bin/brisk serve" in line
