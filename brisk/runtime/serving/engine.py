"""SGLang's offline engine with ISD: generate through SGLang in this process, without a port.

:func:`isd_engine` builds ``sglang.Engine`` from the same arguments ``brisk serve`` gives the
HTTP server (:func:`~brisk.runtime.serving.launch.server_arguments`): the CPU flags and stand-ins
for ``device="cpu"``, speculative algorithm ``BRISK_ISD`` with its options. A notebook then calls
``engine.generate(input_ids=..., sampling_params=...)`` and ``engine.shutdown()``.

The engine runs SGLang's scheduler and detokenizer in child processes started with ``spawn``,
which inherit this process's ``os.environ`` and ``sys.path`` at start-up; so the environment the
server would get (``SGLANG_USE_CPU_ENGINE``, the stand-ins on ``PYTHONPATH``) is set in
``os.environ`` and kept (SGLang's parent-side code reads ``SGLANG_USE_CPU_ENGINE`` too), and on
CPU the stand-ins go first on ``sys.path`` here as well: this process then imports SGLang
against them, as a CPU server does. ``BRISK_ISD``'s options travel in the engine's arguments,
the plugin config of the model's config. Importing this module imports neither SGLang nor
torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from brisk.runtime.serving.launch import Device, server_arguments
from brisk.runtime.serving.options import BriskISDOptions

__all__ = ["engine_kwargs", "isd_engine"]

_SET_HERE = ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH")


def engine_kwargs(flags: Sequence[str]) -> dict[str, Any]:
    """``ServerArgs`` keyword arguments equal to SGLang command-line ``flags``: the values the
    flags set (parsed by SGLang's own parser), not its defaults, so ``sglang.Engine(**kwargs)``
    fills the rest as it does for any caller (``log_level="error"`` among them)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.Engine")
    ServerArgs.add_cli_args(parser)
    parsed = vars(parser.parse_args(list(flags)))
    return {k: v for k, v in parsed.items() if v != parser.get_default(k)}


def isd_engine(
    model: str | os.PathLike[str],
    *,
    stride: int | None = BriskISDOptions.stride,
    device: Device = "cpu",
    options: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
    **kwargs: Any,
) -> Any:
    """An ``sglang.Engine`` serving ``model`` with ISD at ``stride`` (by default the options'
    stride; None: SGLang's plain decoding), on ``device``.

    ``options`` are ``BRISK_ISD``'s other options (``temperature``, ``corrector``, ``seed``, …,
    as in :class:`~brisk.runtime.serving.options.BriskISDOptions`), checked here so a bad one
    fails with one line before any process starts; ``extra_args`` are SGLang flags as
    ``brisk serve`` passes them through, and ``kwargs`` are ``ServerArgs`` fields
    (``dtype="float32"``); both override brisk's flags. The caller owns the engine and must
    ``shutdown()`` it.
    """
    isd: dict[str, object] | None = None
    if stride is not None:
        isd = {**(options or {}), "stride": stride}  # checked by server_arguments
    elif options:
        raise ValueError("options: BRISK_ISD's options need a stride (ISD decoding)")
    flags, env = server_arguments(model, device=device, extra_args=extra_args, isd=isd)
    for name in _SET_HERE:
        if name in env:
            os.environ[name] = env[name]
    if device == "cpu":
        from brisk.runtime.serving.cpu import STANDINS

        if str(STANDINS) not in sys.path:
            sys.path.insert(0, str(STANDINS))

    import sglang

    return sglang.Engine(**{**engine_kwargs(flags), **kwargs})
