"""A real SGLang server for the serving tests, and the micro model it serves.

The model is built here, in seconds, so a fresh clone needs no checkpoint: the micro tiny Qwen3
(:meth:`TinyModelConfig.micro`, the char tokenizer), randomly initialised from a fixed seed, with
its output layer scaled by :data:`LOGIT_SCALE` so that greedy decoding has a clear margin between
the top two logits (the smallest gap over the test's prompts: 8e-4 unscaled, 1.3e-2 scaled) and
a last-bit difference between SGLang's CPU attention and transformers' cannot flip a token. The
server runs it in float32, as transformers does (brisk's launcher passes the dtype ``brisk
decode`` takes on the device; SGLang's ``--dtype auto`` would take float16).

:func:`sdar_checkpoint` ships a model as I-DLM ships its checkpoints (architecture
``SDARForCausalLM``, its own configuration and model code beside the weights), and
:func:`start_brisk_serve` starts a server through ``brisk serve`` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from brisk.runtime.serving.launch import (
    OVERRIDE_FLAG,
    ServerLaunch,
    isd_flags,
    server_launch,
)
from brisk.runtime.serving.options import PLUGIN_KEY
from brisk.runtime.serving.process import ServerProcess, start_server

__all__ = [
    "LOGIT_SCALE",
    "RealServer",
    "build_micro_model",
    "generate",
    "greedy_reference",
    "isd_server_args",
    "post_generate",
    "post_json",
    "sdar_checkpoint",
    "start_brisk_serve",
    "start_real_server",
    "task_prompts",
    "task_texts",
    "train_micro_idlm",
]

LOGIT_SCALE = 16.0
START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RealServer:
    """A running server: its base URL, the model directory it serves and its log."""

    url: str
    model: Path
    log: Path
    startup_s: float


def build_micro_model(out: Path, seed: int = 0) -> Path:
    """The micro causal model and its tokenizer, saved with ``save_pretrained`` under ``out``."""
    import torch

    from brisk.worlds.arithmetic.model import TinyModelConfig, build_model
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model(TinyModelConfig.micro(), tokenizer)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def train_micro_idlm(out: Path, steps: int = 150) -> Path:
    """A micro I-DLM base on the trivial task, trained in ≈ 10 s (tests/runtime's
    ``micro_base``): its MASK slots propose blocks the verifier often accepts, so the ISD tests
    exercise acceptance and KV keeping, not only cold starts (the random micro model's drafts
    are almost never accepted). The checkpoint directory."""
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.runtime.train.base.recipe import train_base

    cfg = BaseTrainConfig.smoke(str(out)).replace(steps=steps)
    return Path(train_base(cfg, show_progress=False).checkpoint)


def micro_corrector(model_dir: Path, out: Path, stride: int, K: int = 4) -> Path:
    """A random corrector for ``model_dir`` at ``stride`` (weights N(0, 0.3²): it re-ranks
    candidates, so head-on drafts differ from the base's), saved under ``out``."""
    import torch

    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.corrector import Corrector, CorrectorConfig

    backbone = HFBackbone.from_pretrained(model_dir)
    config = CorrectorConfig.small(backbone.hidden_size, backbone.vocab_size, M=stride - 1, K=K)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        head = Corrector(config)
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.3)
    head.save_pretrained(out)
    return out


def task_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` prompts of the trivial task's test split, as text."""
    import itertools

    from brisk.worlds.arithmetic.task import TaskConfig
    from brisk.worlds.arithmetic.task import generate as problems

    return [p.prompt for p in itertools.islice(problems(TaskConfig.trivial(), "test", seed), n)]


def task_prompts(model_dir: Path, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of the trivial task's test split, tokenized as brisk decodes them."""
    from transformers import AutoTokenizer

    from brisk.runtime.prompts import encode_prompts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return encode_prompts(tokenizer, task_texts(n, seed))


SDAR_CONFIG = """\
from transformers import Qwen3Config


class SDARConfig(Qwen3Config):
    model_type = "sdar"

    def __init__(self, block_size=4, mask_token_id=None, **kwargs):
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        super().__init__(**kwargs)
"""

SDAR_MODEL = """\
from transformers import Qwen3ForCausalLM, Qwen3Model

from .configuration_sdar import SDARConfig


class SDARModel(Qwen3Model):
    config_class = SDARConfig


class SDARForCausalLM(Qwen3ForCausalLM):
    config_class = SDARConfig
"""


def sdar_checkpoint(model_dir: Path, out: Path, block_size: int = 4) -> Path:
    """``model_dir``'s weights and tokenizer shipped as an I-DLM checkpoint: architecture
    ``SDARForCausalLM``, ``model_type`` ``sdar``, ``auto_map`` to its own
    ``configuration_sdar.py`` / ``modeling_sdar.py`` beside the weights (a Qwen3 config and
    model: the weights are the micro model's), ``mask_token_id`` and ``block_size``."""
    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.name.endswith((".safetensors", ".json")) and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    config = json.loads((model_dir / "config.json").read_text())
    assert isinstance(config.get("mask_token_id"), int), "a MASK id to ship"
    auto_map = {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
    }
    config |= {
        "architectures": ["SDARForCausalLM"],
        "model_type": "sdar",
        "block_size": block_size,
        "auto_map": auto_map,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "configuration_sdar.py").write_text(SDAR_CONFIG)
    (out / "modeling_sdar.py").write_text(SDAR_MODEL)
    return out


def greedy_reference(
    model_dir: Path, prompts: list[list[int]], max_new_tokens: int
) -> tuple[list[list[int]], float]:
    """Greedy AR decoding with transformers in float32, written as the definition (the full
    sequence's forward, argmax of the last logits, append), never stopping at EOS; and the
    smallest top-1 − top-2 logit gap over all steps (the margin the comparison relies on)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs, margin = [], float("inf")
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(max_new_tokens):
                logits = model(torch.tensor([ids])).logits[0, -1]  # [V]
                top = logits.topk(2).values
                margin = min(margin, float(top[0] - top[1]))
                ids.append(int(logits.argmax()))
            outputs.append(ids[len(prompt) :])
    return outputs, margin


def generate(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """SGLang's greedy decoding of ``prompts`` (token ids) in one batched ``/generate`` call."""
    body = {
        "input_ids": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    return [answer["output_ids"] for answer in post_generate(url, body)]


def post_generate(url: str, body: dict[str, Any]) -> Any:
    """``POST /generate`` with ``body``; the decoded JSON answer (``urllib.error.HTTPError``
    when the server refuses the request)."""
    return post_json(url, "/generate", body)


def post_json(url: str, path: str, body: dict[str, Any]) -> Any:
    """``POST`` ``body`` to ``url + path``; the decoded JSON answer (``urllib.error.HTTPError``
    when the server refuses the request)."""
    request = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read())


def isd_server_args(stride: int, options: object = None) -> list[str]:
    """SGLang's flags for ``BRISK_ISD`` at stride N (:func:`isd_flags`), at most 16 requests,
    as SGLang is launched without ``brisk serve``: ``options`` (a mapping, or the path of a
    YAML / JSON file holding one; default ``{"stride": N}``) as the plugin config, the model
    config's ``brisk`` key in ``--json-model-override-args``."""
    config = {PLUGIN_KEY: {"stride": stride} if options is None else options}
    flags = [*isd_flags(stride), "--max-running-requests", "16"]
    return [*flags, OVERRIDE_FLAG, json.dumps(config)]


def start_real_server(
    workdir: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    model: Path | None = None,
    drafter: dict[str, object] | None = None,
) -> tuple[ServerProcess, RealServer]:
    """Serve ``model`` (default: the micro model, built under ``workdir``) on a free loopback
    port (CPU), with ``extra_args`` after brisk's CPU flags and ``env`` added to the server's
    environment; ``drafter`` (the ``BRISK_DRAFTER`` options) serves a drafter for it.

    The caller owns the returned process and must ``stop()`` it, also when this raises after
    starting it: on failure it is stopped here before the error propagates.
    """
    if model is None:
        model = build_micro_model(workdir / "model")
    launch_on = partial(
        server_launch,
        model,
        device="cpu",
        extra_args=extra_args or [],
        env={**_one_thread_env(), **(env or {})},
        drafter=drafter,
    )
    server, startup = start_server(launch_on, workdir / "server.log", START_TIMEOUT_S)
    return server, RealServer(server.launch.url, model, server.log, startup)


def start_brisk_serve(
    workdir: Path, model: Path, flags: list[str], sglang_args: list[str] | None = None
) -> tuple[ServerProcess, RealServer]:
    """``brisk serve --model MODEL FLAGS -- SGLANG_ARGS`` on a free loopback port: the command a
    user runs (it replaces itself with SGLang's launcher, so the process group is the server's).
    Ownership as :func:`start_real_server`."""

    def launch_on(port: int) -> ServerLaunch:
        serve = ["serve", "--model", str(model), "--port", str(port), *flags]
        argv = (sys.executable, "-m", "brisk.cli", *serve, "--", *(sglang_args or []))
        return ServerLaunch(argv=argv, env=_one_thread_env(), url=f"http://127.0.0.1:{port}")

    server, startup = start_server(launch_on, workdir / "server.log", START_TIMEOUT_S)
    return server, RealServer(server.launch.url, model, server.log, startup)


def _one_thread_env() -> dict[str, str]:
    """This machine's 2 cores are shared with the rest of the suite: one thread per process."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
