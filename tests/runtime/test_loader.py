"""The one loader: device and dtype resolved and checked once, the same default everywhere, and
every command that runs a model reaching it through ``--device`` / ``--dtype``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from brisk.runtime import loader
from brisk.runtime.loader import Placement, load_model, placement, training_placement
from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
from brisk.worlds.arithmetic.tokenizer import char_tokenizer
from tests.runtime.test_cli_errors import one_line_error

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    build_model(TinyModelConfig.micro(), tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU machine as one with a bf16-capable GPU (what the defaults see; no kernel runs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(loader, "_check_runs", lambda where: None)
    monkeypatch.setattr(loader, "_announced", False)


@NO_CUDA
def test_a_cpu_machine_runs_on_the_cpu_in_float32_silently(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert placement() == Placement(torch.device("cpu"), torch.float32)
    assert placement("cpu", "bf16") == Placement(torch.device("cpu"), torch.bfloat16)
    assert capsys.readouterr().err == ""


@pytest.mark.usefixtures("a_gpu")
def test_a_gpu_machine_defaults_to_cuda_in_bf16_said_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert placement() == Placement(torch.device("cuda", 0), torch.bfloat16)
    assert placement(None, "float32") == Placement(torch.device("cuda", 0), torch.float32)
    assert placement("cpu") == Placement(torch.device("cpu"), torch.float32)
    err = capsys.readouterr().err.splitlines()
    assert err == ["brisk: running on cuda:0 in bfloat16 (--device and --dtype choose)"]
    assert placement("cuda", "bfloat16") == Placement(torch.device("cuda", 0), torch.bfloat16)
    assert capsys.readouterr().err == ""  # given explicitly: nothing to say


@pytest.mark.usefixtures("a_gpu")
def test_training_takes_each_ranks_own_gpu_and_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert training_placement("auto", "auto", distributed=True) == (torch.device("cuda", 3), "bf16")
    assert training_placement("cpu", "auto", distributed=False) == (torch.device("cpu"), "fp32")
    assert training_placement("auto", "fp32", distributed=False) == (
        torch.device("cuda", 0),
        "fp32",
    )


def test_a_gpu_without_bf16_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    with pytest.raises(ValueError, match=r"^--dtype: Tesla V100 \(cuda:0\) has no bfloat16"):
        placement("cuda", "bfloat16", announce=False)


@pytest.mark.parametrize(
    ("device", "dtype", "message"),
    [
        pytest.param("gpu", None, "--device: 'gpu' is not a torch device", id="no-such-device"),
        pytest.param("cpu", "half", "--dtype: expected float32, bfloat16 or float16", id="dtype"),
        pytest.param("meta", None, "--device: meta is not one brisk runs on", id="meta"),
    ],
)
def test_bad_placements_name_their_flag(device: str, dtype: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}"):
        placement(device, dtype, announce=False)


@NO_CUDA
def test_cuda_without_a_gpu_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^--device: cuda requested, but CUDA is not available"):
        placement("cuda", announce=False)


def test_load_model_reads_the_weights_in_the_dtype_asked(checkpoint: Path) -> None:
    loaded = load_model(checkpoint, device="cpu", dtype="bfloat16")
    assert loaded.placement == Placement(torch.device("cpu"), torch.bfloat16)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.mask_token_id == loaded.tokenizer.mask_token_id == 3
    assert not loaded.model.training


def test_load_model_errors_name_the_flag(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--checkpoint: .* is not a checkpoint directory"):
        load_model(tmp_path, where="--checkpoint")
    with pytest.raises(ValueError, match=r"^--mask-token-id: 500 is outside the vocabulary"):
        load_model(checkpoint, mask_token_id=500)


# Every command that runs a model takes --device and --dtype: on this machine (no GPU) asking
# for CUDA reaches the loader and is one line naming the flag, before anything is decoded.
@NO_CUDA
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["decode", "--model", "{ckpt}", "--prompts", "{prompts}"], id="decode"),
        pytest.param(
            ["train", "selfgen", "--checkpoint", "{ckpt}", "--out", "{out}", "--problems", "2"],
            id="selfgen",
        ),
        pytest.param(
            [
                "train",
                "corrector",
                "collect",
                "--checkpoint",
                "{ckpt}",
                "--out",
                "{out}",
                "--problems",
                "2",
            ],
            id="collect",
        ),
        pytest.param(["train", "eval", "--checkpoint", "{ckpt}", "--problems", "2"], id="eval"),
        pytest.param(
            ["train", "headroom", "--checkpoint", "{ckpt}", "--samples", "{samples}"], id="headroom"
        ),
        pytest.param(["experiment", "proposal", "--config", "{experiment}"], id="experiment"),
        pytest.param(
            ["experiment", "corrector", "--config", "{experiment}"], id="corrector-experiment"
        ),
        pytest.param(["train", "base", "--out", "{out}", "--steps", "1"], id="base-training"),
    ],
)
def test_every_model_command_takes_device_and_dtype(
    command: list[str], checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1"}) + "\n")
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"prompt": "1+1", "completion": "2", "correct": True}) + "\n")
    experiment = tmp_path / "experiment.toml"
    experiment.write_text(f'out_dir = "{tmp_path / "x"}"\n')
    names = {
        "ckpt": checkpoint,
        "prompts": prompts,
        "out": tmp_path / "out",
        "samples": samples,
        "experiment": experiment,
    }
    argv = [part.format(**names) for part in command]
    one_line_error([*argv, "--device", "cuda"], capsys, "--device", "CUDA is not available")
    if command[0] != "train" or command[1] not in ("base",):
        one_line_error([*argv, "--dtype", "half"], capsys, "--dtype")
