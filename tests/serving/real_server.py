"""A real SGLang server for the serving tests, and the micro model it serves.

The model is built here, in seconds, so a fresh clone needs no checkpoint: the micro tiny Qwen3
(:meth:`TinyModelConfig.micro`, the char tokenizer), randomly initialised from a fixed seed, with
its output layer scaled by :data:`LOGIT_SCALE` so that greedy decoding has a clear margin between
the top two logits (the smallest gap over the test's prompts: 8e-4 unscaled, 1.3e-2 scaled) and
a last-bit difference between SGLang's CPU attention and transformers' cannot flip a token. The
server runs it in float32, as transformers does (SGLang's ``--dtype auto`` would take float16).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from brisk.runtime.serving.launch import ServerProcess, isd_flags, server_launch, start_server

__all__ = [
    "LOGIT_SCALE",
    "RealServer",
    "build_micro_model",
    "generate",
    "greedy_reference",
    "isd_server_args",
    "post_generate",
    "start_real_server",
    "task_prompts",
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

    from brisk.runtime.tiny.model import TinyModelConfig, build_model
    from brisk.runtime.tiny.tokenizer import char_tokenizer

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
    from brisk.runtime.train.base import train_base
    from brisk.runtime.train.config import BaseTrainConfig

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


def task_prompts(model_dir: Path, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of the trivial task's test split, tokenized as brisk decodes them."""
    import itertools

    from transformers import AutoTokenizer

    from brisk.runtime.prompts import encode_prompts
    from brisk.runtime.tiny.task import TaskConfig
    from brisk.runtime.tiny.task import generate as problems

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stream = problems(TaskConfig.trivial(), "test", seed)
    return encode_prompts(tokenizer, [p.prompt for p in itertools.islice(stream, n)])


def greedy_reference(model_dir: Path, prompts: list[list[int]], max_new_tokens: int
                     ) -> tuple[list[list[int]], float]:  # fmt: skip
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
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens,
                            "ignore_eos": True},
    }  # fmt: skip
    return [answer["output_ids"] for answer in post_generate(url, body)]


def post_generate(url: str, body: dict[str, Any]) -> Any:
    """``POST /generate`` with ``body``; the decoded JSON answer (``urllib.error.HTTPError``
    when the server refuses the request)."""
    request = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read())


def isd_server_args(stride: int) -> list[str]:
    """SGLang's flags for ``BRISK_ISD`` at stride N (:func:`isd_flags`), at most 16 requests."""
    return [*isd_flags(stride), "--max-running-requests", "16"]


def start_real_server(
    workdir: Path,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    model: Path | None = None,
) -> tuple[ServerProcess, RealServer]:
    """Serve ``model`` (default: the micro model, built under ``workdir``) on a free loopback
    port (CPU), with ``extra_args`` after brisk's CPU flags and ``env`` added to the server's
    environment.

    The caller owns the returned process and must ``stop()`` it, also when this raises after
    starting it: on failure it is stopped here before the error propagates.
    """
    if model is None:
        model = build_micro_model(workdir / "model")
    launch_on = partial(server_launch, model, device="cpu",
                        extra_args=["--dtype", "float32", *(extra_args or [])],
                        env={**_one_thread_env(), **(env or {})})  # fmt: skip
    server, startup = start_server(launch_on, workdir / "server.log", START_TIMEOUT_S)
    return server, RealServer(server.launch.url, model, server.log, startup)


def _one_thread_env() -> dict[str, str]:
    """This machine's 2 cores are shared with the rest of the suite: one thread per process."""
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
