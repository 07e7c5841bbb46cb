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
from pathlib import Path

from brisk.runtime.serving.launch import ServerProcess, free_port, server_launch

__all__ = [
    "LOGIT_SCALE",
    "RealServer",
    "build_micro_model",
    "generate",
    "greedy_reference",
    "start_real_server",
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
    request = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        answers = json.loads(response.read())
    return [answer["output_ids"] for answer in answers]


def start_real_server(workdir: Path) -> tuple[ServerProcess, RealServer]:
    """Build the micro model under ``workdir`` and serve it on a free loopback port (CPU).

    The caller owns the returned process and must ``stop()`` it, also when this raises after
    starting it: on failure it is stopped here before the error propagates.
    """
    model = build_micro_model(workdir / "model")
    launch = server_launch(model, free_port(), device="cpu", extra_args=["--dtype", "float32"],
                           env=_one_thread_env())  # fmt: skip
    server = ServerProcess(launch, workdir / "server.log").start()
    try:
        startup = server.wait_ready(START_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server, RealServer(launch.url, model, server.log, startup)


def _one_thread_env() -> dict[str, str]:
    """This machine's 2 cores are shared with the rest of the suite: one thread per process."""
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
