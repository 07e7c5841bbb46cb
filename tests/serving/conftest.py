"""The serving tests run in ``.venv-serving`` (``make test-serving``): SGLang 0.5.23 installed
light (no CUDA dependency set) beside brisk. Elsewhere this directory is not collected (see
``tests/conftest.py``); it is never skipped where SGLang is present.

SGLang's vision configs import torchvision, whose wheels here need CUDA torch: when it cannot
be imported, brisk's CPU stand-in takes its place (:func:`ensure_torchvision`). Every test
brings its own plugin state (:func:`plugins`), since ``load_plugins()`` runs once per process.
One real SGLang server (:func:`real_server`) is shared by the whole session.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from brisk.runtime.serving.cpu import ensure_torchvision
from tests.serving.real_server import RealServer, start_real_server

ensure_torchvision()

assert importlib.util.find_spec("sglang") is not None, "tests/serving runs in .venv-serving"


@pytest.fixture(scope="session")
def plugins() -> None:
    """SGLang's own plugin loading, as its launcher and schedulers run it (once per process)."""
    import sglang.srt.plugins as sp

    sp.load_plugins()


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """A real SGLang server on CPU, on a free loopback port, serving the micro model of
    :mod:`tests.serving.real_server`: started once (bounded by its start-up timeout) and always
    stopped by its own process group, whatever the tests do."""
    process, server = start_real_server(tmp_path_factory.mktemp("real_server"))
    try:
        yield server
    finally:
        process.stop()


MICRO_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 12,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "mask_token_id": 11,
    "rms_norm_eps": 1e-6,
}


def config_only_checkpoint(path: Path, **overrides: object) -> Path:
    """A checkpoint of only a micro Qwen3 ``config.json`` at ``path`` (new: SGLang caches a
    model's config by its path), with ``overrides`` (None removes a key): what server-argument
    resolution and SGLang's ``ModelConfig`` read."""
    path.mkdir(parents=True)
    config = {k: v for k, v in {**MICRO_CONFIG, **overrides}.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    return path
