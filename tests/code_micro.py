"""The code world at micro scale, built through the command line as a user builds it, for the
main suite (``tests/worlds/test_code_world_path.py``, ``tests/runtime/test_drafter_bpe.py``) and
the serving suite (``tests/serving/test_code_server.py``).

:func:`build_code_world` writes two configs and runs ``brisk train ar`` then ``brisk train base
--init`` (≈ 30 s here, one thread each), the tokenizer cached inside the world's directory;
:func:`build_code_ar` runs the first alone (the AR model, a drafter's target).
:func:`code_ar_once` trains that AR model once per test run for every module that starts from it
(:mod:`tests.session_cache`), and ``build_code_world(world, ar=...)`` and :func:`copy_code_ar` copy
it into a world instead of training it again. The corpus is small on purpose. Its training files
are ``operator.py``, ``stat.py`` and ``genericpath.py``: 73 short, regular functions of at most
400 characters, which both streams of a 2-layer model learn by heart in a few hundred steps. Its
held-out files are ``email/__init__.py``, ``secrets.py`` and ``copyreg.py``: 12 documented
functions. So a greedy ISD decode at stride 4 both rejects drafts (the held-out prompts: a micro
model does not generalize, its MASK slots miss) and accepts whole blocks (the training functions'
prompts: slots and verifier agree on the memorized bodies); a prompt file of both splits
exercises cold starts, partial and full acceptance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

__all__ = [
    "HELDOUT",
    "STRIDE",
    "TRAIN",
    "accept_totals",
    "brisk",
    "brisk_decode",
    "build_code_ar",
    "build_code_world",
    "code_ar_once",
    "copy_code_ar",
    "problem_rows",
    "read_jsonl",
    "write_jsonl",
]

STRIDE = 4  # M = 3 MASK slots: accept lengths 0..3
TRAIN = ("operator.py", "stat.py", "genericpath.py")  # on the training side of the split
HELDOUT = ("email/__init__.py", "secrets.py", "copyreg.py")  # held out: the problems
TIMEOUT_S = 300  # one command; the whole build takes ≈ 30 s on the 2-core CPU

MODEL = """\
[model]
name = "code"
hidden_size = 64
layers = 2
heads = 4
kv_heads = 2
intermediate_size = 128
max_positions = 512
vocab_size = 512

[model.corpus]
include = {include}
"""

AR = """\
out_dir = "{out}"
seed = 0
steps = 200
batch_size = 8
lr = 3e-3
min_lr = 3e-4
warmup_steps = 5
log_every = 5
save_every = 0
final_eval_problems = 0
threads = 1
max_minutes = 5.0

[corpus]
name = "stdlib"
max_chars = 400

[corpus.corpus]
include = {include}

"""

BASE = """\
out_dir = "{out}"
init = "{init}"
seed = 0
steps = 300
batch_size = 8
lr = 3e-3
min_lr = 3e-4
warmup_steps = 3
log_every = 5
eval_every = 0
eval_problems = 0
final_eval_problems = 0
save_every = 0
threads = 1
max_minutes = 5.0
strides = [{stride}]

[task]
name = "stdlib"
max_chars = 400

[task.corpus]
include = {include}

"""


def brisk(world: Path, *args: object, timeout: float = TIMEOUT_S) -> str:
    """``brisk ARGS`` (``python -m brisk.cli``) as a user runs it, with the world's tokenizer
    cache and one thread; its stdout. A failure is an ``AssertionError`` with the output."""
    env = {
        **os.environ,
        "BRISK_CACHE": str(world / "cache"),  # never the user's cache
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    argv = [sys.executable, "-m", "brisk.cli", *map(str, args)]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(argv[2:])}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def _ar_toml(world: Path) -> str:
    include = json.dumps([*TRAIN, *HELDOUT])
    return AR.format(out=world / "ar", include=include) + MODEL.format(include=include)


def build_code_ar(world: Path) -> Path:
    """The micro code world's AR model under ``world`` (``brisk train ar``: ``ar.toml``, the run
    ``ar/``, the tokenizer cache ``cache/``); returns its ``final`` checkpoint, a Qwen3 causal LM
    with the byte-level BPE tokenizer (the AR target of the drafter tests)."""
    world.mkdir(parents=True, exist_ok=True)
    (world / "ar.toml").write_text(_ar_toml(world))
    brisk(world, "train", "ar", "--config", world / "ar.toml", "--no-progress")
    return world / "ar" / "final"


def code_ar_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The world directory :func:`build_code_ar` filled, trained once per test run (≈ 10 s, one
    thread): every module and xdist worker that asks shares it, read-only (keyed by the AR and
    model configs and the corpus files)."""
    from tests.session_cache import built_once

    key = {"ar": AR, "model": MODEL, "files": [*TRAIN, *HELDOUT]}
    return built_once(tmp_path_factory, "code-ar", key, build_code_ar)


def copy_code_ar(ar_world: Path, world: Path) -> Path:
    """``ar_world``'s AR run and tokenizer cache copied under ``world`` as :func:`build_code_ar`
    lays them out (``ar.toml`` naming ``world``'s run); returns ``world``'s ``ar/final``."""
    world.mkdir(parents=True, exist_ok=True)
    for name in ("ar", "cache"):
        shutil.copytree(ar_world / name, world / name)
    (world / "ar.toml").write_text(_ar_toml(world))
    return world / "ar" / "final"


def build_code_world(world: Path, ar: Path | None = None) -> Path:
    """The micro code world under ``world``: ``ar.toml`` / ``base.toml``, the runs ``ar/`` and
    ``base/`` (each with ``metrics.jsonl``), the tokenizer cache ``cache/``; returns the I-DLM
    base's ``final`` checkpoint. With ``ar`` (:func:`code_ar_once`) the AR run is that one,
    copied, not trained again."""
    ar = build_code_ar(world) if ar is None else copy_code_ar(ar, world)
    include = json.dumps([*TRAIN, *HELDOUT])
    base = world / "base"
    (world / "base.toml").write_text(
        BASE.format(out=base, init=ar, stride=STRIDE, include=include)
        + MODEL.format(include=include)
    )
    brisk(world, "train", "base", "--config", world / "base.toml", "--no-progress")
    return base / "final"


def problem_rows(world: Path, checkpoint: Path, split: str, n: int = 200) -> list[dict[str, Any]]:
    """``brisk decode problems`` of ``split`` (``test``: the held-out functions; ``train``:
    those of the training files), as written to ``problems-SPLIT.jsonl``."""
    out = world / f"problems-{split}.jsonl"
    brisk(
        world,
        "decode",
        "problems",
        "--checkpoint",
        checkpoint,
        "--n",
        n,
        "--split",
        split,
        "--out",
        out,
    )
    return read_jsonl(out)


def brisk_decode(
    world: Path, model: Path, prompts: Path, out: Path, *flags: object
) -> list[dict[str, Any]]:
    """``brisk decode --stride 4`` of the prompt file on the CPU, one thread, plus ``flags``;
    its rows."""
    brisk(
        world,
        "decode",
        "--model",
        model,
        "--prompts",
        prompts,
        "--stride",
        STRIDE,
        "--device",
        "cpu",
        "--threads",
        1,
        "--no-progress",
        "--out",
        out,
        *flags,
    )
    return read_jsonl(out)


def accept_totals(rows: list[dict[str, Any]]) -> list[int]:
    """Verify rounds with accept length L = 0..M, over all rows."""
    return [sum(r["accept_hist"][L] for r in rows) for L in range(STRIDE)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
