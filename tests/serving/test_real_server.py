"""A real SGLang server (CPU engine, no speculative algorithm) against transformers: plain greedy
decoding of a handful of prompts, batched in one request, equals greedy AR token for token; and
``brisk serve``'s command line and its one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from brisk.runtime.serving.cpu import STANDINS
from brisk.runtime.serving.launch import CPU_FLAGS, ServerLaunch
from brisk.runtime.serving.process import (
    FREE_PORTS,
    PortTaken,
    ServerProcess,
    free_port,
    start_server,
)
from tests.serving.real_server import RealServer, generate, greedy_reference

MAX_NEW_TOKENS = 24
MIN_MARGIN = 1e-4  # ≫ float32 rounding of these logits (|logit| ≲ 10): no near-tie to flip


def prompts(n: int, seed: int) -> list[list[int]]:
    """Random prompts of 1–9 character tokens (ids 5..100 of the char tokenizer; no specials)."""
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(5, 101, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def test_plain_greedy_decoding_equals_greedy_ar(real_server: RealServer) -> None:
    batch = prompts(6, seed=0)
    expected, margin = greedy_reference(real_server.model, batch, MAX_NEW_TOKENS)
    assert margin > MIN_MARGIN, f"the reference has a near-tie (gap {margin:.2e}): fix the model"
    served = generate(real_server.url, batch, MAX_NEW_TOKENS)
    for i, (want, got) in enumerate(zip(expected, served, strict=True)):
        first = next((t for t, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
        assert got == want, f"prompt {i}: first difference at token {first}: {got} != {want}"


def brisk(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "brisk.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_brisk_serve_dry_run_prints_the_cpu_command(real_server: RealServer) -> None:
    model = real_server.model
    result = brisk(
        *f"serve --model {model} --device cpu --port 30123 --dry-run -- --dtype float32".split()
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    words = line.split()
    assert "SGLANG_USE_CPU_ENGINE=1" in words
    pythonpath = next(w for w in words if w.startswith("PYTHONPATH=")).split("=", 1)[1]
    assert pythonpath.split(os.pathsep)[0] == str(STANDINS)  # first: the stand-ins shadow
    assert line.endswith(f"--port 30123 {' '.join(CPU_FLAGS)} --dtype float32")


def test_brisk_serve_refuses_a_missing_model_and_a_port_in_use(
    real_server: RealServer, tmp_path: Path
) -> None:
    missing = brisk("serve", "--model", str(tmp_path / "nope"), "--device", "cpu")
    assert missing.returncode == 2
    no_model = f"--model: {tmp_path / 'nope'} is not a model directory (no config.json)"
    assert missing.stderr.strip() == f"brisk: error: {no_model}"
    port = real_server.url.rsplit(":", 1)[1]
    taken = brisk("serve", "--model", str(real_server.model), "--device", "cpu", "--port", port)
    assert taken.returncode == 2
    assert taken.stderr.strip() == f"brisk: error: --port: 127.0.0.1:{port} is already in use"


def test_a_server_that_never_answers_is_stopped_with_its_children(tmp_path: Path) -> None:
    """The fixture's guarantees on a stand-in process tree: bounded wait, the log's tail in the
    error, and ``stop()`` ends the launcher and the child it started (its process group)."""
    child_pid = tmp_path / "child.pid"
    code = (
        f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
        f"'import time; time.sleep(600)']); open({str(child_pid)!r}, 'w').write(str(c.pid)); "
        f"print('not a server', flush=True); time.sleep(600)"
    )
    launch = ServerLaunch(
        argv=(sys.executable, "-c", code),
        env=dict(os.environ),
        url=f"http://127.0.0.1:{free_port()}",
    )
    server = ServerProcess(launch, tmp_path / "log").start()
    try:
        with pytest.raises(RuntimeError, match=r"did not answer within 3 s:\nnot a server"):
            server.wait_ready(timeout=3)
    finally:
        server.stop(grace=5)
    assert server.process is not None
    assert server.process.returncode is not None
    assert not running(int(child_pid.read_text()))


def running(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process its parent has not reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_a_port_taken_before_the_server_binds_it_is_retried_on_a_fresh_one(tmp_path: Path) -> None:
    """Between :func:`free_port` and the server's bind another process can take the port; the
    server then logs uvicorn's bind error and hangs. :func:`start_server` sees the error (a
    timeout would not be retried), stops that server by its group and starts again on a fresh
    port."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health_generate").write_text("ok")
    ports: list[int] = []

    def launch_on(port: int) -> ServerLaunch:
        ports.append(port)
        if len(ports) == 1:
            return _bind_fails(port, tmp_path / "first.pid")
        return _answers_health(port, www)

    server, _ = start_server(launch_on, tmp_path / "log", timeout=60)
    try:
        assert len(ports) == 2
        assert ports[0] != ports[1]
        assert all(port in FREE_PORTS for port in ports)
        assert server.launch.url == f"http://127.0.0.1:{ports[1]}"
        assert not running(int((tmp_path / "first.pid").read_text()))
    finally:
        server.stop(grace=5)

    tries: list[int] = []
    with pytest.raises(PortTaken, match=r"could not bind http://127\.0\.0\.1:\d+:\n.*Errno 98"):
        start_server(
            lambda port: tries.append(port) or _bind_fails(port, tmp_path / "pid"),
            tmp_path / "log",
            timeout=60,
            attempts=2,
        )
    assert len(tries) == 2


def test_a_server_that_exits_on_its_bind_error_is_retried_on_a_fresh_port(tmp_path: Path) -> None:
    """SGLang may also exit (3) right after uvicorn's bind error: that is the same taken port,
    retried, not a failed server (two test workers once drew one port and the second failed)."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health_generate").write_text("ok")
    ports: list[int] = []

    def launch_on(port: int) -> ServerLaunch:
        ports.append(port)
        if len(ports) == 1:
            return _bind_fails(port, tmp_path / "first.pid", then_exit=True)
        return _answers_health(port, www)

    server, _ = start_server(launch_on, tmp_path / "log", timeout=60)
    try:
        assert len(ports) == 2
        assert server.launch.url == f"http://127.0.0.1:{ports[1]}"
    finally:
        server.stop(grace=5)


def test_free_port_does_not_draw_from_the_global_generator() -> None:
    """Processes that seeded ``random`` alike (pytest workers, a user's seeded jobs) must not
    draw the same ports: the draw takes nothing from the global generator's state."""
    import random

    random.seed(0)
    state = random.getstate()
    free_port()
    assert random.getstate() == state


def test_a_server_whose_port_another_answers_on_is_not_taken_for_ready(tmp_path: Path) -> None:
    """SGLang binds its port seconds after it starts; when another server took the port
    meanwhile, that one answers ``/health_generate`` first. The launched server is ready only
    once its own log says it bound the address: here it never does (it logs the bind error
    after 3 s), so the wait ends in :class:`PortTaken`, not in talking to the other server."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health_generate").write_text("ok")
    port = free_port()
    other = ServerProcess(_answers_health(port, www), tmp_path / "other.log").start()
    try:
        other.wait_ready(30)
        ours = ServerProcess(_bind_fails(port, tmp_path / "pid", delay=3.0), tmp_path / "ours.log")
        with ours, pytest.raises(PortTaken):
            ours.wait_ready(30)
    finally:
        other.stop(grace=5)


def _answers_health(port: int, www: Path) -> ServerLaunch:
    """A stand-in that says it bound its address as uvicorn does and answers
    ``/health_generate``."""
    code = (
        f"import http.server, functools; print('INFO:     Uvicorn running on "
        f"http://127.0.0.1:{port} (Press CTRL+C to quit)', flush=True); "
        f"handler = functools.partial(http.server.SimpleHTTPRequestHandler, "
        f"directory={str(www)!r}); "
        f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), handler).serve_forever()"
    )
    return ServerLaunch(
        argv=(sys.executable, "-c", code), env=dict(os.environ), url=f"http://127.0.0.1:{port}"
    )


def _bind_fails(
    port: int, pid_file: Path, delay: float = 0.0, then_exit: bool = False
) -> ServerLaunch:
    """A stand-in that logs uvicorn's bind error (after ``delay`` seconds, as SGLang binds
    once its model is up) and hangs, as SGLang's server does, or with ``then_exit`` exits 3, as
    it also does."""
    end = "raise SystemExit(3)" if then_exit else "time.sleep(600)"
    code = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        f"time.sleep({delay}); "
        f'print("ERROR: [Errno 98] error while attempting to bind on address '
        f"('127.0.0.1', {port}): address already in use\", flush=True); "
        f"{end}"
    )
    return ServerLaunch(
        argv=(sys.executable, "-c", code), env=dict(os.environ), url=f"http://127.0.0.1:{port}"
    )
