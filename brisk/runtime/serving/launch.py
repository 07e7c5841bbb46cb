"""Launching a real SGLang server: its command line and environment.

:func:`server_launch` builds what ``brisk serve`` and the real-server tests run. On CPU that is
SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, without which SGLang asks for vLLM's rotary
embedding) with the native torch attention backend, no CUDA graphs, no overlap scheduling, no
radix cache, a 4096-token KV pool (SGLang would otherwise size it from free memory: 15 GB and a
minute of start-up), a scheduler that sleeps when idle (it otherwise keeps a core busy polling:
10.2 core-seconds in 10 idle seconds, 0.15 with it), and the CPU stand-ins of
:mod:`brisk.runtime.serving.cpu` on its path. On CUDA it is SGLang's own defaults. Either way
the server computes in the dtype ``brisk decode`` takes on that device (:data:`SERVER_DTYPES`).
Arguments passed through come last, so they override.

``--json-model-override-args`` carries what brisk sets in the served model's config, merged with
one passed through: the causal LM a checkpoint is served as, the one ``brisk decode`` runs
(:func:`brisk.runtime.architectures.served_as`: an I-DLM ``SDARForCausalLM`` as the causal Qwen3
it is for ISD, SGLang's own SDAR class attending bidirectionally; an architecture brisk cannot
serve causally is refused before anything starts), a MASK id, and the options of brisk's
algorithm, the plugin config (:data:`~brisk.runtime.serving.options.PLUGIN_KEY`), which SGLang
hands every process with the model's config.

:mod:`brisk.runtime.serving.process` starts the command and stops it. Nothing here imports
SGLang; reading a local checkpoint's architecture imports transformers (and so torch).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from brisk._json import parse_json_object
from brisk.runtime.serving.cpu import activate
from brisk.runtime.serving.drafter_options import (
    BriskDrafterOptions,
    check_drafter_pair,
    drafter_flags,
)
from brisk.runtime.serving.options import PLUGIN_KEY, BriskISDOptions

__all__ = [
    "CPU_FLAGS",
    "CRASH_DIAGNOSTICS",
    "OVERRIDE_FLAG",
    "SERVER_DTYPES",
    "ServerLaunch",
    "isd_flags",
    "server_arguments",
    "server_launch",
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

OVERRIDE_FLAG = "--json-model-override-args"
"""SGLang's flag that sets keys of the served model's config (module docstring)."""


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


CRASH_DIAGNOSTICS = ("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "SGLANG_PYSPY_DUMP_BEFORE_CRASH")
"""SGLang's switches for what it does when a server's child process ends: a CUDA core dump and a
``py-spy`` dump of the schedulers, after a 5 s sleep (both off on a CPU server, see
:func:`server_arguments`)."""


def _no_crash_diagnostics(env: Mapping[str, str]) -> dict[str, str]:
    """The crash diagnostics (:data:`CRASH_DIAGNOSTICS`) a CPU server cannot take, switched off.

    When a child process ends (a scheduler stopped by the SIGTERM that stops the server, or one
    that crashed) SGLang's tokenizer manager sleeps 5 s "to let GPU activity settle", then
    dumps the schedulers' stacks with ``py-spy`` and asks CUDA for a core dump. A CPU server has
    no CUDA, and no ``py-spy`` unless one is on its ``PATH``, so the 5 s are slept for nothing on
    every stop: a micro model's CPU server (``tests.serving.real_server.start_real_server``)
    took 7.5 s from SIGTERM to its process group until the group was gone with them on, 2.5 s
    with them off (measured by hand, once each, on a 2-core AMD EPYC; no committed benchmark).
    A variable the environment sets already wins (the caller uses ``setdefault``).

    >>> _no_crash_diagnostics({"PATH": ""})
    {'SGLANG_CUDA_COREDUMP_BEFORE_CRASH': '0', 'SGLANG_PYSPY_DUMP_BEFORE_CRASH': '0'}
    """
    coredump, pyspy = CRASH_DIAGNOSTICS
    off = {coredump: "0"}
    if shutil.which("py-spy", path=env.get("PATH", "")) is None:
        off[pyspy] = "0"
    return off


@dataclass(frozen=True)
class ServerLaunch:
    """A server's command line and full environment (``env`` replaces the caller's)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    url: str

    def shell(self) -> str:
        """The command as one shell line, with the variables it sets (for logs and READMEs)."""
        set_here = ("SGLANG_USE_CPU_ENGINE", *CRASH_DIAGNOSTICS, "PYTHONPATH")
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
    overrides: Mapping[str, object] | None = None,
) -> tuple[tuple[str, ...], dict[str, str]]:
    """SGLang's arguments for serving ``model`` and the full environment its processes need;
    the one place both the HTTP server (:func:`server_launch`) and the offline engine
    (:func:`brisk.runtime.serving.engine.isd_engine`) take them from.

    ``dtype`` (None: :data:`SERVER_DTYPES` of the device, what ``brisk decode`` computes in
    there) is SGLang's ``--dtype``; ``address`` (host, port) is for the HTTP server only; ``isd``
    (the ``BRISK_ISD`` options, e.g. ``{"stride": 4}``) makes decoding ISD through brisk's
    plugin; ``drafter`` (the ``BRISK_DRAFTER`` options, e.g. ``{"drafter": "DIR"}``) makes it a
    drafter's blocks verified by the model, the pair checked here (a ``ValueError``
    ``drafter: ...`` when the drafter was not built for the model). The options are checked
    and become the plugin config (module docstring); ``overrides`` are more keys of the model's
    config (a MASK id), over those passed through; ``extra_args`` come last, so they override.

    A local checkpoint's architecture decides the model class (module docstring; a ``ValueError``
    ``model: ...`` for one brisk cannot serve causally); a ``model`` that is not a local
    directory with a config.json (a hub name) goes to SGLang as it is.

    >>> flags, env = server_arguments("m", isd={"stride": 2}, env={})
    >>> flags[:6]
    ('--model-path', 'm', '--dtype', 'float32', '--device', 'cpu')
    >>> flags[-11:-9]
    ('--speculative-algorithm', 'BRISK_ISD')
    >>> flags[-2:]
    ('--json-model-override-args', '{"brisk":{"stride":2}}')
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
        for name, value in _no_crash_diagnostics(run_env).items():
            run_env.setdefault(name, value)
    if isd is not None and drafter is not None:
        raise ValueError("drafter: a server decodes with ISD or with a drafter, not both")
    plugin: dict[str, object] | None = None
    if isd is not None:
        flags += isd_flags(BriskISDOptions.from_mapping(isd).stride)  # every option checked
        plugin = dict(isd)
    if drafter is not None:
        options = BriskDrafterOptions.from_mapping(drafter)
        flags += drafter_flags(_drafter_block(model, options.drafter))
        plugin = {**drafter, "drafter": str(Path(options.drafter).resolve())}
    passed, asked = _model_overrides_passed(extra_args)
    config = {**_causal_overrides(model, asked), **asked, **(overrides or {})}
    if plugin is not None:
        config[PLUGIN_KEY] = dict(sorted(plugin.items()))
    if config:
        flags += [OVERRIDE_FLAG, json.dumps(config, separators=(",", ":"))]
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
        asked = parse_json_object(value, OVERRIDE_FLAG)
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
    overrides: Mapping[str, object] | None = None,
) -> ServerLaunch:
    """``python -m sglang.launch_server`` for ``model`` on ``host:port`` with
    :func:`server_arguments`; with ``isd`` (the ``BRISK_ISD`` options, e.g. ``{"stride": 4}``)
    decoding is ISD through brisk's plugin; with ``drafter`` (the ``BRISK_DRAFTER`` options) a
    drafter's blocks verified by the model; ``overrides``: more keys of the model's config.

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
        overrides=overrides,
    )
    argv = (python, "-m", "sglang.launch_server", *flags)
    return ServerLaunch(argv=argv, env=run_env, url=f"http://{host}:{port}")


def _quoted(value: str) -> str:
    import shlex

    return shlex.quote(value)
