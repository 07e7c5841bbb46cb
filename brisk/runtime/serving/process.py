"""A real SGLang server's process: a free port, a launch started and waited for, and stopped.

:class:`ServerProcess` starts a :class:`~brisk.runtime.serving.launch.ServerLaunch` in its own
process group, waits for the server to answer a generation, and stops it by that group (the
launcher and its scheduler and detokenizer children), never by name; :func:`start_server` retries
on a fresh port (:func:`free_port`) when another process took the one it was given. Nothing here
imports SGLang.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from brisk.runtime.serving.launch import ServerLaunch

__all__ = ["FREE_PORTS", "PortTaken", "ServerProcess", "free_port", "port_in_use", "start_server"]


def port_in_use(host: str, port: int) -> bool:
    """Whether a server already listens on ``host:port`` (a port in TIME_WAIT is free: the
    server binds with ``SO_REUSEADDR``, as uvicorn does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


_PORTS = random.SystemRandom()
FREE_PORTS = range(12000, 22000)
"""Where :func:`free_port` looks: below the kernel's ephemeral range (32768 up by default, from
which every ``bind(0)`` and outgoing connection takes its port, so a port picked there can be
taken by anyone before the server binds it) and below the 22000–29999 from which SGLang picks its
own internal ports."""


def free_port(host: str = "127.0.0.1", attempts: int = 64) -> int:
    """A port free on ``host`` now, drawn at random from :data:`FREE_PORTS`.

    Another process may still bind it before the server does; :func:`start_server` retries on a
    fresh port when that happens.
    """
    # OS entropy, not the global generator: processes that seeded `random` alike (test workers,
    # a user's seeded jobs) would otherwise draw the same ports and collide
    for port in _PORTS.sample(FREE_PORTS, attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {attempts} tries of {FREE_PORTS}")


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after :func:`free_port`."""


_BIND_FAILED = b"error while attempting to bind on address"


class ServerProcess:
    """A launched server, owned by this object: :meth:`start`, :meth:`wait_ready`, :meth:`stop`.

    The server runs in a new session, so its process group id is the launcher's pid and
    :meth:`stop` signals exactly the processes this object started. A context manager.
    """

    def __init__(self, launch: ServerLaunch, log: str | os.PathLike[str]) -> None:
        self.launch = launch
        self.log = Path(log)
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def start(self) -> ServerProcess:
        self._log_file = self.log.open("wb")
        self.process = subprocess.Popen(
            self.launch.argv,
            env=dict(self.launch.env),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout: float) -> float:
        """Seconds until ``/health_generate`` answers (a real generation) *and* this server's
        log says it bound its address (another process that took the port may answer the
        health check first); raises ``RuntimeError`` with the log's tail when the server exits
        or ``timeout`` passes, and :class:`PortTaken` as soon as its log says it could not
        bind its port."""
        assert self.process is not None, "start() first"
        bound = f"Uvicorn running on {self.launch.url}".encode()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            exited = self.process.poll() is not None
            log = self.log.read_bytes() if self.log.exists() else b""
            if _BIND_FAILED in log:
                # uvicorn logs the failure, then hangs in its shutdown or exits: either way the
                # port was taken, and a fresh one is the answer
                raise PortTaken(f"the server could not bind {self.launch.url}:\n{self.tail()}")
            if exited:
                raise RuntimeError(f"the server exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.launch.url}/health_generate", timeout=10) as r:
                    if r.status == 200 and bound in log:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after ``grace`` s."""
        if self.process is not None:
            pgid = self.process.pid  # start_new_session: the group is the launcher's pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(pgid):
                self.process.poll()  # reap the launcher so the group can empty
                time.sleep(0.2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_server(
    launch_on: Callable[[int], ServerLaunch],
    log: str | os.PathLike[str],
    timeout: float,
    attempts: int = 3,
) -> tuple[ServerProcess, float]:
    """Start ``launch_on(port)`` on a :func:`free_port` and wait until it answers; on
    :class:`PortTaken` stop it and try again on a fresh port, ``attempts`` times in all.

    Returns the running server (the caller stops it) and its start-up seconds. Whatever else
    goes wrong stops the server and propagates.
    """
    for attempt in range(1, attempts + 1):
        server = ServerProcess(launch_on(free_port()), log).start()
        try:
            return server, server.wait_ready(timeout)
        except PortTaken:
            server.stop()
            if attempt == attempts:
                raise
        except BaseException:
            server.stop()
            raise
    raise AssertionError("unreachable")
