"""``brisk serve --dry-run`` (no SGLang needed): the device and dtype ``brisk decode`` takes by
default, passed to SGLang; the model class an I-DLM checkpoint is served as; one line and exit
status 2 for what cannot be served."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from tests.runtime.conftest import brisk_here

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 12,
    "mask_token_id": 11,
}


def checkpoint(path: Path, **overrides: object) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**CONFIG, **overrides}))
    return path


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    """``brisk serve ARGS``: every call here is a dry run or refused, so it starts nothing
    (the program itself, ``python -m brisk.cli serve``, runs in the serving suite's
    ``test_real_server.py``)."""
    return brisk_here("serve", *args)


def flag(words: list[str], name: str) -> str:
    """The value after the last ``name`` (SGLang's parser takes the last)."""
    return words[len(words) - 1 - words[::-1].index(name) + 1]


def test_the_defaults_are_brisk_decodes(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "m")
    result = serve("--model", str(model), "--dry-run")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    cuda = torch.cuda.is_available()
    assert flag(words, "--dtype") == ("bfloat16" if cuda else "float32")
    assert ("SGLANG_USE_CPU_ENGINE=1" in words) is not cuda
    assert ("SGLANG_CUDA_COREDUMP_BEFORE_CRASH=0" in words) is not cuda
    assert ("--device" in words and flag(words, "--device") == "cpu") is not cuda


def test_a_cpu_server_takes_no_crash_diagnostics_it_cannot_take(tmp_path: Path) -> None:
    """SGLang sleeps 5 s on every stop before a CUDA core dump and a py-spy dump: off on CPU
    (no CUDA; py-spy only when it is on the server's PATH), as the environment sets them."""
    from brisk.runtime.serving.launch import server_launch

    model = checkpoint(tmp_path / "m")
    coredump, pyspy = "SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "SGLANG_PYSPY_DUMP_BEFORE_CRASH"
    env = server_launch(model, 30000, device="cpu", env={"PATH": ""}).env
    assert (env[coredump], env[pyspy]) == ("0", "0")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "py-spy").write_text("#!/bin/sh\n")
    (tools / "py-spy").chmod(0o755)
    env = server_launch(model, 30000, device="cpu", env={"PATH": str(tools)}).env
    assert (env[coredump], pyspy in env) == ("0", False)
    given = {"PATH": "", coredump: "1", pyspy: "1"}
    env = server_launch(model, 30000, device="cpu", env=given).env
    assert (env[coredump], env[pyspy]) == ("1", "1")
    env = server_launch(model, 30000, device="cuda", env={"PATH": ""}).env
    assert {coredump, pyspy}.isdisjoint(env)  # SGLang's own defaults on a GPU


@pytest.mark.parametrize(
    ("given", "dtype"), [("bf16", "bfloat16"), ("float16", "float16"), ("float32", "float32")]
)
def test_a_dtype_given_reaches_sglang(tmp_path: Path, given: str, dtype: str) -> None:
    model = checkpoint(tmp_path / "m")
    result = serve("--model", str(model), "--device", "cpu", "--dtype", given, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert flag(shlex.split(result.stdout), "--dtype") == dtype


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "int8"], "--dtype: expected float32, bfloat16 or float16, got 'int8'"),
        (["--device", "mps"], "--device: brisk serve runs on cpu or cuda, got 'mps'"),
        (["--device", "cuda:1"], "--device: brisk serve runs on cpu or cuda, got 'cuda:1'"),
        (["--device", "tpu"], "--device: brisk serve runs on cpu or cuda, got 'tpu'"),
    ],
)
def test_a_device_or_dtype_that_cannot_serve_is_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = serve("--model", str(checkpoint(tmp_path / "m")), *args, "--dry-run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"brisk: error: {message}")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA refuses it")
def test_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    result = serve("--model", str(checkpoint(tmp_path / "m")), "--device", "cuda", "--dry-run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "brisk: error: --device: cuda requested, but CUDA is not available here"
    )


def test_an_idlm_checkpoint_is_served_as_qwen3(tmp_path: Path) -> None:
    model = checkpoint(
        tmp_path / "sdar", architectures=["SDARForCausalLM"], model_type="sdar", block_size=4
    )
    result = serve(
        "--model",
        str(model),
        "--device",
        "cpu",
        "--stride",
        "4",
        "--dry-run",
        "--",
        "--json-model-override-args",
        '{"block_size": 3}',
    )
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words.count("--json-model-override-args") == 1
    overrides = json.loads(flag(words, "--json-model-override-args"))
    assert overrides == {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "block_size": 3,
        "brisk": {"stride": 4},  # the plugin config
    }
    plain = serve("--model", str(checkpoint(tmp_path / "qwen3")), "--device", "cpu", "--dry-run")
    assert "--json-model-override-args" not in shlex.split(plain.stdout)


@pytest.mark.parametrize("architecture", ["LLaDA2MoeModelLM", "BertModel", "NoSuchModelForLM"])
def test_an_architecture_that_cannot_be_served_causally_is_one_line(
    tmp_path: Path, architecture: str
) -> None:
    model = checkpoint(tmp_path / "m", architectures=[architecture], model_type="x")
    result = serve("--model", str(model), "--device", "cpu", "--dry-run")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"brisk: error: --model: {model} is a {architecture}, which brisk cannot serve as a "
        "causal LM (not a transformers causal LM class, and not one brisk runs as its causal "
        "twin: SDARForCausalLM)"
    )


def dry_run(*args: str) -> tuple[int, str, str]:
    """``brisk serve … --dry-run``: status, stdout, stderr."""
    done = serve(*args, "--dry-run")
    return done.returncode, done.stdout, done.stderr


def isd_config(stdout: str) -> dict[str, object]:
    """The plugin config a dry run hands SGLang: the model config's ``brisk`` key, in
    ``--json-model-override-args``; no environment variable carries it."""
    words = shlex.split(stdout)
    assert not [w for w in words if w.startswith("BRISK_") and "=" in w]
    config: dict[str, object] = json.loads(flag(words, "--json-model-override-args"))["brisk"]
    return config


def test_the_isd_flags_are_the_algorithms_options(
    tmp_path: Path,
) -> None:
    """Each ISD flag given, and only those, reaches the plugin config (paths absolute); the
    server reads the rest from the options' defaults."""
    model = ["--model", str(checkpoint(tmp_path / "m")), "--device", "cpu", "--stride", "4"]
    given = ["--temperature", "1", "--top-k", "8", "--seed", "3", "--impl", "naive"]
    status, out, err = dry_run(*model, *given, "--log-blocks", "logs")
    assert status == 0, err
    assert isd_config(out) == {
        "stride": 4,
        "temperature": 1.0,
        "top_k": 8,
        "seed": 3,
        "impl": "naive",
        "log_blocks": str(Path("logs").resolve()),
    }
    status, out, err = dry_run(*model)
    assert (status, isd_config(out)) == (0, {"stride": 4})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "1"], "--temperature: needs --stride (ISD decoding)"),
        (["--shadow"], "--shadow: needs --stride (ISD decoding)"),
        (["--stride", "1"], "--stride: need an integer N ≥ 2, got 1"),
        (["--stride", "4", "--top-k", "0"], "--top-k: need an integer K ≥ 1"),
        (["--stride", "4", "--temperature", "-1"], "--temperature: need a number ≥ 0, got -1.0"),
        (["--stride", "4", "--shadow"], "--shadow: needs a corrector to run beside the base"),
        (["--stride", "4", "--corrector", "/nope"], "--corrector: /nope holds no corrector"),
        (["--stride", "4", "--impl", "cuda"], "--impl: invalid choice: 'cuda'"),
    ],
)
def test_a_bad_isd_flag_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    model = ["--model", str(checkpoint(tmp_path / "m")), "--device", "cpu"]
    status, out, err = dry_run(*model, *args)
    assert (status, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"brisk: error: {message}")
