"""The plugin inside SGLang 0.5.23 (light install, CPU): SGLang's own plugin loading finds it,
its algorithm and hooks are in place, server arguments resolve on a config-only checkpoint, and
bad options stop the server with one line naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from brisk.runtime.serving.plugin import ALGORITHM, HOOKS, installed

pytestmark = pytest.mark.usefixtures("plugins")

TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 12, "max_position_embeddings": 256,
    "tie_word_embeddings": False, "mask_token_id": 11, "rms_norm_eps": 1e-6,
}  # fmt: skip


def checkpoint(tmp_path: Path, **overrides: object) -> Path:
    """A config-only checkpoint: what server-args resolution reads."""
    path = tmp_path / "model"
    path.mkdir(exist_ok=True)
    config = {**TINY_CONFIG, **overrides}
    config = {k: v for k, v in config.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    return path


def algorithm_config(tmp_path: Path, **options: object) -> Path:
    path = tmp_path / "brisk.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def server_args(model: Path, config: Path | None) -> object:
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=str(model), dllm_algorithm=ALGORITHM, device="cpu",
                      dllm_algorithm_config=None if config is None else str(config))  # fmt: skip


def test_load_plugins_registers_the_algorithm() -> None:
    from sglang.srt.dllm.algorithm import algo_name_to_cls, get_algorithm_cls

    from brisk.runtime.serving.algorithm import BriskISD

    assert algo_name_to_cls[ALGORITHM] is BriskISD
    assert get_algorithm_cls(ALGORITHM) is BriskISD
    assert "LowConfidence" in algo_name_to_cls  # SGLang's own algorithms are still there


def test_every_hook_is_applied() -> None:
    """SGLang logs a hook that fails to apply: assert each target is wrapped by brisk's hook."""
    assert installed() == dict.fromkeys(HOOKS, True)


def test_server_args_resolve_on_a_config_only_checkpoint(tmp_path: Path) -> None:
    from sglang.srt.dllm.config import DllmConfig

    cfg = algorithm_config(tmp_path, stride=4, temperature=0)
    config = DllmConfig.from_server_args(server_args(checkpoint(tmp_path), cfg))
    assert config.algorithm == ALGORITHM
    assert config.block_size == 7  # 2N − 1
    assert config.mask_id == 11
    assert config.algorithm_config == {"stride": 4, "temperature": 0}
    assert not config.requires_separate_context_encoding


def test_other_algorithms_keep_sglangs_resolution(tmp_path: Path) -> None:
    """The hook hands other algorithms to SGLang, which still refuses unknown architectures."""
    from sglang.srt.dllm.config import DllmConfig
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=str(checkpoint(tmp_path)), dllm_algorithm="LowConfidence",
                    device="cpu")  # fmt: skip
    with pytest.raises(RuntimeError, match="Unknown diffusion LLM: Qwen3ForCausalLM"):
        DllmConfig.from_server_args(sa)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stride": 4, "blocksize": 7}, "blocksize: unknown BriskISD option"),
        ({"stride": 1}, "stride: need an integer N ≥ 2"),
        ({"stride": 4, "block_size": 4}, "block_size: BriskISD's block is 2N − 1 = 7"),
        ({"temperature": -1}, "temperature: need a number ≥ 0"),
        ({"impl": "cuda"}, "impl: need auto, naive or triton"),
        ({"shadow": True}, "shadow: needs a corrector"),
        ({"corrector": "/nonexistent"}, "corrector: /nonexistent holds no corrector"),
    ],
)
def test_bad_options_name_the_option(tmp_path: Path, options: dict, message: str) -> None:
    from sglang.srt.dllm.config import DllmConfig

    from brisk.runtime.serving.options import OptionError

    sa = server_args(checkpoint(tmp_path), algorithm_config(tmp_path, **options))
    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        DllmConfig.from_server_args(sa)


def test_a_model_without_a_mask_token_is_refused(tmp_path: Path) -> None:
    from sglang.srt.dllm.config import DllmConfig

    sa = server_args(checkpoint(tmp_path, mask_token_id=None), None)
    with pytest.raises(RuntimeError, match="declares no integer mask_token_id"):
        DllmConfig.from_server_args(sa)


@pytest.mark.parametrize(
    ("head", "options", "message"),
    [
        ({"M": 3, "K": 4, "hidden": 32, "vocab": 12}, {"stride": 5}, "built for M = 3, stride 5"),
        ({"M": 3, "K": 4, "hidden": 64, "vocab": 12}, {"stride": 4}, "trained for hidden 64"),
        ({"M": 3, "K": 4, "hidden": 32, "vocab": 12}, {"stride": 4, "top_k": 8}, "ranks K = 4"),
    ],
)
def test_a_corrector_for_another_backbone_is_refused(
    tmp_path: Path, head: dict, options: dict, message: str
) -> None:
    from sglang.srt.dllm.config import DllmConfig

    from brisk.runtime.corrector import Corrector, CorrectorConfig
    from brisk.runtime.serving.options import OptionError

    Corrector(CorrectorConfig.small(head["hidden"], head["vocab"], M=head["M"], K=head["K"])
              ).save_pretrained(tmp_path / "head")  # fmt: skip
    cfg = algorithm_config(tmp_path, corrector=str(tmp_path / "head"), **options)
    with pytest.raises(OptionError, match=message):
        DllmConfig.from_server_args(server_args(checkpoint(tmp_path), cfg))


def test_launch_is_refused_without_variable_length_commits(tmp_path: Path) -> None:
    """SGLang 0.5.23's dLLM scheduler commits whole blocks: the call the launch pipeline makes
    (``arg_groups/dllm_hook.py``: ``get_algorithm_cls(name).configure_server_args(sa)``) stops
    with what is missing instead of serving wrong tokens. (The pipeline itself needs a GPU
    platform before it reaches that call.)"""
    from sglang.srt.dllm.algorithm import get_algorithm_cls

    sa = server_args(checkpoint(tmp_path), algorithm_config(tmp_path, stride=4))
    with pytest.raises(RuntimeError, match="commits whole blocks; ISD commits L \\+ 1 tokens"):
        get_algorithm_cls(ALGORITHM).configure_server_args(sa)


def test_requests_the_algorithm_cannot_serve_are_rejected() -> None:
    from types import SimpleNamespace

    from brisk.runtime.serving.algorithm import BriskISD

    def req(**params: object) -> SimpleNamespace:
        sp = {"temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, **params}
        cfg = SimpleNamespace(algorithm_config={"stride": 4, "temperature": 0})
        return SimpleNamespace(sampling_params=SimpleNamespace(**sp), dllm_config=cfg)

    assert BriskISD.validate_request(req()) is None
    assert "asks for temperature 0.7" in BriskISD.validate_request(req(temperature=0.7, top_k=-1))
    assert "repetition_penalty" in BriskISD.validate_request(req(repetition_penalty=1.2))
    logprobs = req()
    logprobs.return_logprob = True
    assert "logprobs" in BriskISD.validate_request(logprobs)


def test_brisk_without_the_plugin_imports_nothing_of_sglang() -> None:
    """Even where SGLang is installed, brisk (its CLI, the serving options, benchmark and
    loopback server included) imports SGLang only when SGLang loads the plugin."""
    import subprocess
    import sys

    code = (
        "import sys, brisk, brisk.cli, brisk.runtime.serving.options, "
        "brisk.runtime.serving.bench, brisk.runtime.serving.loopback, "
        "brisk.runtime.serving.plugin, brisk.runtime.serving.dflash; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
