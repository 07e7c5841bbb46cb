"""Launching a real SGLang server: its command line and environment, and its process.

:func:`server_launch` builds what ``brisk serve`` and the real-server tests run. On CPU that is
SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, without which SGLang asks for vLLM's rotary
embedding) with the native torch attention backend, no CUDA graphs, no overlap scheduling, no
radix cache, a 4096-token KV pool (SGLang would otherwise size it from free memory: 15 GB and a
minute of start-up), a scheduler that sleeps when idle (it otherwise keeps a core busy polling:
10.2 core-seconds in 10 idle seconds, 0.15 with it), and the CPU stand-ins of
:mod:`brisk.runtime.serving.cpu` on its path. On CUDA it is SGLang's own defaults. Either way
the server computes in the dtype ``brisk decode`` takes on that device (:data:`SERVER_DTYPES`).
Arguments passed through come last, so they override.

A checkpoint is served as the causal LM ``brisk decode`` runs
(:func:`brisk.runtime.architectures.served_as`): an I-DLM ``SDARForCausalLM`` as the causal Qwen3
it is for ISD (SGLang's own SDAR class attends bidirectionally), through
``--json-model-override-args`` (merged with one passed through); an architecture brisk cannot
serve causally is refused before anything starts.

:class:`ServerProcess` starts the command in its own process group, waits for the server to
answer a generation, and stops it by that group (the launcher and its scheduler and detokenizer
children), never by name. Nothing here imports SGLang; reading a local checkpoint's
architecture imports transformers (and so torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from brisk.runtime.serving.cpu import activate
from brisk.runtime.serving.drafter_options import (
    DRAFTER_CONFIG_ENV,
    BriskDrafterOptions,
    check_drafter_pair,
    drafter_flags,
)
from brisk.runtime.serving.options import BriskISDOptions

__all__ = [
    "CPU_FLAGS",
    "FREE_PORTS",
    "ISD_CONFIG_ENV",
    "OVERRIDE_FLAG",
    "SERVER_DTYPES",
    "PortTaken",
    "ServerLaunch",
    "ServerProcess",
    "free_port",
    "isd_flags",
    "port_in_use",
    "server_arguments",
    "server_launch",
    "start_server",
]

Device = Literal["cpu", "cuda"]

CPU_FLAGS: tuple[str, ...] = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    # SGLang 0.5.23's spelling of --disable-cuda-graph (deprecated there)
    "--cuda-graph-backend-decode",
    "disabled",
    "--cuda-graph-backend-prefill",
    "disabled",
    "--disable-overlap-schedule",
    "--disable-radix-cache",
    "--max-total-tokens",
    "4096",
    # the idle scheduler otherwise polls its sockets flat out: one core per idle server
    "--sleep-on-idle",
)
"""The flags of SGLang's CPU server, as ``brisk serve --device cpu`` passes them."""


SERVER_DTYPES: dict[str, str] = {"cpu": "float32", "cuda": "bfloat16"}
"""The dtype a server computes in when none is given: the default of ``brisk decode`` on the same
device (:func:`brisk.runtime.loader.default_placement`). SGLang's own ``--dtype auto`` would
serve a float32 checkpoint in float16 on the CPU."""


ISD_CONFIG_ENV = "BRISK_ISD_CONFIG"
"""The variable that hands ``BRISK_ISD``'s options to SGLang's processes: a YAML/JSON file, or
the options themselves as a JSON object."""


def isd_flags(stride: int) -> tuple[str, ...]:
    """SGLang's flags for speculative algorithm ``BRISK_ISD`` at stride N: a chain (top-k 1) of
    2N − 1 verify slots, ``[pending, x_1..x_M, MASK×M]``, run synchronously (no overlap).

    >>> isd_flags(4)[:4]
    ('--speculative-algorithm', 'BRISK_ISD', '--speculative-num-draft-tokens', '7')
    """
    n = 2 * stride - 1
    return (
        "--speculative-algorithm",
        "BRISK_ISD",
        "--speculative-num-draft-tokens",
        str(n),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-steps",
        str(n - 1),
        "--disable-overlap-schedule",
    )


@dataclass(frozen=True)
class ServerLaunch:
    """A server's command line and full environment (``env`` replaces the caller's)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    url: str

    def shell(self) -> str:
        """The command as one shell line, with the variables it sets (for logs and READMEs)."""
        set_here = ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH", ISD_CONFIG_ENV, DRAFTER_CONFIG_ENV)
        extra = [
            f"{k}={_quoted(self.env[k])}"
            for k in set_here
            if k in self.env and self.env.get(k) != os.environ.get(k)
        ]
        return " ".join([*extra, *map(_quoted, self.argv)])


def server_arguments(
    model: str | os.PathLike[str],
    *,
    device: Device = "cpu",
    dtype: str | None = None,
    address: tuple[str, int] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    isd: Mapping[str, object] | None = None,
    drafter: Mapping[str, object] | None = None,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """SGLang's arguments for serving ``model`` and the full environment its processes need;
    the one place both the HTTP server (:func:`server_launch`) and the offline engine
    (:func:`brisk.runtime.serving.engine.isd_engine`) take them from.

    ``dtype`` (None: :data:`SERVER_DTYPES` of the device, what ``brisk decode`` computes in
    there) is SGLang's ``--dtype``; ``address`` (host, port) is for the HTTP server only; ``isd``
    (the ``BRISK_ISD`` options, e.g. ``{"stride": 4}``) makes decoding ISD through brisk's
    plugin; ``drafter`` (the ``BRISK_DRAFTER`` options, e.g. ``{"drafter": "DIR"}``) makes it a
    drafter's blocks verified by the model, the pair checked here (a ``ValueError``
    ``drafter: ...`` when the drafter was not built for the model); ``extra_args`` come last,
    so they override.

    A local checkpoint's architecture decides the model class (module docstring; a ``ValueError``
    ``model: ...`` for one brisk cannot serve causally); a ``model`` that is not a local
    directory with a config.json (a hub name) goes to SGLang as it is.

    >>> flags, env = server_arguments("m", isd={"stride": 2}, env={})
    >>> flags[:6]
    ('--model-path', 'm', '--dtype', 'float32', '--device', 'cpu')
    >>> flags[-9:-7]
    ('--speculative-algorithm', 'BRISK_ISD')
    >>> env["BRISK_ISD_CONFIG"]
    '{"stride":2}'
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r} is not one of cpu, cuda")
    flags = ["--model-path", str(model), "--dtype", dtype or SERVER_DTYPES[device]]
    if address is not None:
        flags += ["--host", address[0], "--port", str(address[1])]
    run_env = dict(os.environ if env is None else env)
    if device == "cpu":
        flags += CPU_FLAGS
        run_env = activate(run_env)
        run_env["SGLANG_USE_CPU_ENGINE"] = "1"
    if isd is not None and drafter is not None:
        raise ValueError("drafter: a server decodes with ISD or with a drafter, not both")
    if isd is not None:
        flags += isd_flags(BriskISDOptions.from_mapping(isd).stride)  # every option checked
        run_env[ISD_CONFIG_ENV] = json.dumps(dict(isd), sort_keys=True, separators=(",", ":"))
    if drafter is not None:
        options = BriskDrafterOptions.from_mapping(drafter)
        flags += drafter_flags(_drafter_block(model, options.drafter))
        run_env[DRAFTER_CONFIG_ENV] = json.dumps(
            {**drafter, "drafter": str(Path(options.drafter).resolve())},
            sort_keys=True,
            separators=(",", ":"),
        )
    passed, asked = _model_overrides_passed(extra_args)
    overrides = {**_causal_overrides(model, asked), **asked}
    if overrides:
        flags += [OVERRIDE_FLAG, json.dumps(overrides, separators=(",", ":"))]
    flags += passed
    return tuple(flags), run_env


def _drafter_block(model: str | os.PathLike[str], drafter: str) -> int:
    """The drafter's block size, after checking it against a local checkpoint's config (a hub
    name is checked by SGLang, while it resolves its arguments)."""
    if not (Path(model) / "config.json").is_file():
        from brisk.runtime.serving.drafter_options import drafter_block_size

        return drafter_block_size(drafter)
    from brisk.runtime.architectures import model_config

    return check_drafter_pair(model_config(Path(model)), drafter)


OVERRIDE_FLAG = "--json-model-override-args"


def _model_overrides_passed(extra_args: Sequence[str]) -> tuple[list[str], dict[str, object]]:
    """``extra_args`` without SGLang's ``--json-model-override-args``, and the overrides it gave
    (the last one, as SGLang's parser takes), to merge with brisk's."""
    rest: list[str] = []
    asked: dict[str, object] = {}
    args = list(extra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == OVERRIDE_FLAG and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith(OVERRIDE_FLAG + "="):
            value, i = arg.partition("=")[2], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{OVERRIDE_FLAG}: not JSON ({err})") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"{OVERRIDE_FLAG}: expected a JSON object, got {value}")
        asked = parsed
    return rest, asked


def _causal_overrides(
    model: str | os.PathLike[str], asked: Mapping[str, object]
) -> dict[str, object]:
    """The overrides that serve a local checkpoint as its causal LM; none when the caller names
    the architecture itself, or ``model`` is no local checkpoint."""
    if "architectures" in asked or not (Path(model) / "config.json").is_file():
        return {}
    from brisk.runtime.architectures import served_as

    try:
        return served_as(model).overrides()
    except ValueError as err:
        raise ValueError(f"model: {str(err).removeprefix('path: ')}") from None


def server_launch(
    model: str | os.PathLike[str],
    port: int,
    *,
    device: Device = "cpu",
    dtype: str | None = None,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    isd: Mapping[str, object] | None = None,
    drafter: Mapping[str, object] | None = None,
) -> ServerLaunch:
    """``python -m sglang.launch_server`` for ``model`` on ``host:port`` with
    :func:`server_arguments`; with ``isd`` (the ``BRISK_ISD`` options, e.g. ``{"stride": 4}``)
    decoding is ISD through brisk's plugin; with ``drafter`` (the ``BRISK_DRAFTER`` options) a
    drafter's blocks verified by the model.

    >>> launch = server_launch("m", 30000, extra_args=["--dtype", "float32"], python="python")
    >>> launch.argv[:5], launch.argv[-2:], launch.env["SGLANG_USE_CPU_ENGINE"]
    (('python', '-m', 'sglang.launch_server', '--model-path', 'm'), ('--dtype', 'float32'), '1')
    >>> "SGLANG_USE_CPU_ENGINE" in server_launch("m", 30000, device="cuda", env={}).env
    False
    """
    flags, run_env = server_arguments(
        model,
        device=device,
        dtype=dtype,
        address=(host, port),
        extra_args=extra_args,
        env=env,
        isd=isd,
        drafter=drafter,
    )
    argv = (python, "-m", "sglang.launch_server", *flags)
    return ServerLaunch(argv=argv, env=run_env, url=f"http://{host}:{port}")


def _quoted(value: str) -> str:
    import shlex

    return shlex.quote(value)


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
            time.sleep(1.0)
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
