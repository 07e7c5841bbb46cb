"""Shared runtime fixtures: a micro base model trained for seconds and its self-generated data."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any
from unittest import mock

import pytest

from brisk.runtime.train.selfgen import SelfGenOptions
from tests.session_cache import built_once

# Small enough for the suite: 40 problems × 2 samples of the trivial task at stride 4.
MICRO_SELFGEN = SelfGenOptions(problems=40, samples=2, stride=4, max_new_tokens=24, chunk=16)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test: loops of many small forwards run several times slower
    with two threads per worker beside the other worker's two, on two cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def micro_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro I-DLM base on the trivial task (150 steps, ~10 s): it answers some problems.
    Trained once per run (:func:`tests.session_cache.built_once`: one xdist worker trains it,
    the other reads it); a test that writes beside it copies it first."""
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.runtime.train.base.recipe import train_base

    cfg = BaseTrainConfig.smoke("").replace(steps=150)

    def build(out: Path) -> None:
        checkpoint = train_base(cfg.replace(out_dir=str(out)), show_progress=False).checkpoint
        assert checkpoint == out / "final", checkpoint

    return built_once(tmp_path_factory, "micro_base", cfg.to_dict(), build) / "final"


@pytest.fixture(scope="session")
def micro_dataset(micro_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro base's self-generated data (``MICRO_SELFGEN``), made once per run as it is."""
    from brisk.runtime.train.selfgen import generate_dataset

    def build(out: Path) -> None:
        generate_dataset(micro_base, out / "data", MICRO_SELFGEN, show_progress=False)

    key = {"base": str(micro_base), "selfgen": MICRO_SELFGEN.to_dict()}
    return built_once(tmp_path_factory, "micro_dataset", key, build) / "data"


@pytest.fixture(scope="session")
def micro_head(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, object]:
    """A head trained (≈ 5 s) on events of test_isd's micro backbone (V = 12, a random,
    peaked Qwen3) at stride 4, T = 1: (backbone, trained head with K = 4, event store)."""
    import torch

    from brisk.runtime.corrector import Corrector
    from brisk.runtime.isd import ISDOptions
    from brisk.runtime.train.corrector.config import CorrectorTrainConfig
    from brisk.runtime.train.corrector.events import collect_events
    from brisk.runtime.train.corrector.recipe import train_corrector
    from tests.runtime.test_isd import micro_backbone

    backbone = micro_backbone()
    out = tmp_path_factory.mktemp("micro_head")
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=16, top_k=6)
    store = collect_events(
        backbone,
        micro_prompts(600, seed=0),
        options,
        out / "events",
        seeds=range(600),
        batch_size=600,
    )
    cfg = CorrectorTrainConfig(
        events=str(store.path),
        out_dir=str(out / "head"),
        K=4,
        head="small",
        epochs=10,
        batch_size=128,
        lr=3e-3,
    )
    with torch.random.fork_rng():
        result = train_corrector(cfg, show_progress=False, backbone=backbone, store=store)
    return backbone, Corrector.from_pretrained(result.checkpoint), store


def micro_prompts(n: int, seed: int) -> list[list[int]]:
    """Random prompts of 1–6 non-MASK tokens for test_isd's micro backbone (MASK = 11)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 11, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def micro_experiment_toml(
    out: Path, base: Path, seeds: list[int], arms: list[str], workers: int
) -> str:
    """A proposal-ablation config small enough for the suite (micro base, stride 4)."""
    return f"""
out_dir = "{out}"
base = "{base}"
stride = 4
seeds = {seeds}
arms = {json.dumps(arms)}
workers = {workers}
[selfgen]
problems = 24
samples = 2
max_new_tokens = 24
[train]
token_budget = 1200
batch_size = 16
[eval]
problems = 12
max_new_tokens = 24
batch_size = 12
"""


def tokenizer_without_mask() -> Any:
    """The tiny world's characters and specials, but no MASK token (a plain causal LM's)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from brisk.worlds.arithmetic.tokenizer import CHARS

    specials = ("<pad>", "<bos>", "<eos>", "<unk>")
    vocab = {t: i for i, t in enumerate((*specials, *CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def proposal_args(base: Path, dataset: Path, out: Path, *extra: str) -> list[str]:
    """``brisk train proposal`` on the micro base and data: 1,500 tokens at a global batch of
    16, stride 4, one thread (the arguments after ``brisk``)."""
    return [
        "train",
        "proposal",
        "--stride",
        "4",
        "--init",
        str(base),
        "--dataset",
        str(dataset),
        "--data",
        "selfgen-all",
        "--token-budget",
        "1500",
        "--batch-size",
        "16",
        "--lr",
        "0.001",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def brisk_here(*args: object, env: Mapping[str, str] | None = None) -> CompletedProcess[str]:
    """``brisk ARGS`` run in this process, as a shell would see it: exit status, stdout and
    stderr; ``env`` is set in ``os.environ`` for the call. For commands that end before they
    start work (bad input, dry runs): the same :func:`brisk.cli.main` as the program, without
    a new interpreter's 4 s of imports. The program's own door, one line and exit 2 from a
    fresh process, is tested where a process matters: a torchrun job and ``--fsdp`` without one
    (``test_fsdp.py``), a full disk (``test_full_disk.py``), ``brisk serve`` (the serving
    suite's ``test_real_server.py``)."""
    from brisk.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env or {}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        status = main([str(a) for a in args])
    return CompletedProcess(["brisk", *map(str, args)], status, out.getvalue(), err.getvalue())


def torchrun(nproc: int, args: list[str]) -> list[str]:
    """The command running ``brisk args`` as ``nproc`` ranks under torchrun (standalone)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--standalone",
        "-m",
        "brisk.cli",
        *args,
    ]


def tiny_base_toml(steps: int, batch_size: int, save_every: int) -> str:
    """A ``brisk train base`` config of a one-layer model on one-digit sums, one thread: a run
    of a few seconds with checkpoints every ``save_every`` steps."""
    return f"""
steps = {steps}
batch_size = {batch_size}
warmup_steps = 2
strides = [2, 4]
log_every = 1
final_eval_problems = 0
eval_problems = 0
save_every = {save_every}
threads = 1
[task]
max_operands = 2
max_digits = 1
ops = "+"
style_weights = [1.0, 0.0, 0.0, 0.0]
reference_weights = [1.0, 0.0, 0.0, 0.0]
verb_weights = [1.0, 0.0, 0.0]
[model]
hidden_size = 32
layers = 1
intermediate_size = 64
max_positions = 128
"""
