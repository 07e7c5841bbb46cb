"""The code world at micro scale, built through the command line as a user builds it, for the
main suite (``tests/worlds/test_code_world_path.py``, ``tests/runtime/test_drafter_bpe.py``) and
the serving suite (``tests/serving/test_code_server.py``).

:func:`build_code_world` writes two configs and runs ``brisk train ar`` then ``brisk train base
--init`` (≈ 30 s here, one thread each), the tokenizer cached inside the world's directory;
:func:`build_code_ar` runs the first alone (the AR model, a drafter's target). The
corpus is small on purpose. Its training files are ``operator.py``, ``stat.py`` and
``genericpath.py``: 73 short, regular functions of at most 400 characters, which both streams of
a 2-layer model learn by heart in a few hundred steps. Its held-out files are
``email/__init__.py``, ``secrets.py`` and ``copyreg.py``: 12 documented functions. So a greedy
ISD decode at stride 4 both rejects drafts (the held-out prompts: a micro model does not
generalize, its MASK slots miss) and accepts whole blocks (the training functions' prompts:
slots and verifier agree on the memorized bodies); a prompt file of both splits exercises cold
starts, partial and full acceptance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "HELDOUT",
    "STRIDE",
    "TRAIN",
    "accept_totals",
    "brisk",
    "brisk_decode",
    "build_code_ar",
    "build_code_world",
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


def build_code_ar(world: Path) -> Path:
    """The micro code world's AR model under ``world`` (``brisk train ar``: ``ar.toml``, the run
    ``ar/``, the tokenizer cache ``cache/``); returns its ``final`` checkpoint, a Qwen3 causal LM
    with the byte-level BPE tokenizer (the AR target of the drafter tests)."""
    world.mkdir(parents=True, exist_ok=True)
    include = json.dumps([*TRAIN, *HELDOUT])
    model = MODEL.format(include=include)
    (world / "ar.toml").write_text(AR.format(out=world / "ar", include=include) + model)
    brisk(world, "train", "ar", "--config", world / "ar.toml", "--no-progress")
    return world / "ar" / "final"


def build_code_world(world: Path) -> Path:
    """The micro code world under ``world``: ``ar.toml`` / ``base.toml``, the runs ``ar/`` and
    ``base/`` (each with ``metrics.jsonl``), the tokenizer cache ``cache/``; returns the I-DLM
    base's ``final`` checkpoint."""
    ar = build_code_ar(world)
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
