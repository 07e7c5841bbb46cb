"""Grading code by running it, HumanEval's way: the problem's prompt, the model's completion,
the problem's tests and ``check(entry_point)`` run as one program; it passes iff it exits 0
within the time limit.

Each program runs in its own Python process (``python -I``: no user site, no environment
paths), in an empty temporary directory that is removed afterwards, as a new session whose whole
process group is killed at the time limit, under resource limits (address space, CPU seconds,
file size, open files), with a minimal environment and, inside, network sockets, subprocesses
and the destructive ``os`` / ``shutil`` calls replaced by ones that raise. That keeps a wrong or
runaway completion from hanging or damaging the grading run; it is not a security boundary
against hostile code: grade untrusted models' code in a container.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TIMEOUT_S", "passes", "run_program"]

TIMEOUT_S = 10.0
MEMORY_BYTES = 2 << 30
FILE_BYTES = 16 << 20

# Runs first in the child (the limits are set there, not in a preexec_fn, which is unsafe in a
# threaded parent): what a test program never needs is made to raise.
GUARD = """\
import os as _os, resource as _resource, shutil as _shutil, socket as _socket
import subprocess as _subprocess

for _limit, _value in {limits!r}:
    _resource.setrlimit(getattr(_resource, _limit), (_value, _value))

def _denied(*args, **kwargs):
    raise PermissionError("not allowed while grading code")

for _name in ("socket", "create_connection", "create_server", "socketpair", "fromfd"):
    setattr(_socket, _name, _denied)
for _name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "remove", "unlink",
              "rmdir", "removedirs", "rename", "renames", "replace", "truncate", "chmod",
              "chown", "putenv", "execv", "execve", "execvp", "execl", "spawnv", "spawnve"):
    if hasattr(_os, _name):
        setattr(_os, _name, _denied)
for _name in ("rmtree", "move", "chown"):
    setattr(_shutil, _name, _denied)
_subprocess.Popen = _denied
del _name, _limit, _value
"""


def passes(completion: str, problem: Mapping[str, Any], timeout: float = TIMEOUT_S) -> bool:
    """Whether ``problem["prompt"] + completion`` passes ``problem["test"]`` (which defines
    ``check``) called on ``problem["entry_point"]``."""
    missing = [k for k in ("prompt", "test", "entry_point") if k not in problem]
    if missing:
        raise ValueError(f"answer: a code problem needs {missing[0]!r} (has {', '.join(problem)})")
    program = (
        f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    )
    return run_program(program, timeout) == 0


def _limits(timeout: float) -> list[tuple[str, int]]:
    return [
        ("RLIMIT_CPU", int(timeout) + 1),
        ("RLIMIT_AS", MEMORY_BYTES),
        ("RLIMIT_FSIZE", FILE_BYTES),
        ("RLIMIT_NOFILE", 64),
    ]


def run_program(source: str, timeout: float = TIMEOUT_S) -> int | None:
    """Run ``source`` as a guarded Python program (module docstring); its exit code, or None when
    it ran past ``timeout`` seconds (and was killed with its whole process group)."""
    with tempfile.TemporaryDirectory(prefix="brisk-code-") as tmp:
        main = Path(tmp) / "program.py"
        run = f"exec(compile({source!r}, 'program.py', 'exec'), {{'__name__': '__main__'}})\n"
        main.write_text(GUARD.format(limits=_limits(timeout)) + "\n" + run)
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen(
            [sys.executable, "-I", str(main)],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
