"""``brisk serve``: a thin launcher over ``python -m sglang.launch_server``.

The command line and environment come from :func:`brisk.runtime.serving.launch.server_launch`
(``--device cpu`` adds SGLang's CPU-engine flags and brisk's CPU stand-ins; ``--stride N``
decodes with ISD, speculative algorithm ``BRISK_ISD`` of brisk's plugin, and the ISD flags, one
per field of :class:`~brisk.runtime.serving.options.BriskISDOptions` (``--stride`` among them),
set its options: ``--corrector`` adds the head; ``--drafter DIR`` serves a DFlash drafter
verified by the model instead, algorithm ``BRISK_DRAFTER``, with the flags of the fields its
options share, ``--temperature``, ``--top-k`` and ``--seed``). The options, checked here with
one line naming a bad flag, reach SGLang as the plugin's config
(:mod:`brisk.runtime.serving.options`: the model config's ``brisk`` key, in SGLang's own
``--json-model-override-args``); arguments after ``--`` go to SGLang unchanged and override.
``--device`` and ``--dtype`` default to what ``brisk decode`` takes
(:func:`brisk.runtime.loader.placement`: the GPU in bfloat16 where CUDA exists, else the CPU in
float32), said once on stderr. The launcher replaces this process, so Ctrl-C and signals reach
SGLang directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path
from typing import Literal

from brisk.cli._common import (
    add_config_arguments,
    add_mask_argument,
    config_overrides,
    flag_errors,
)
from brisk.runtime.serving.drafter_options import BriskDrafterOptions
from brisk.runtime.serving.options import BriskISDOptions, ServedOptions

__all__ = ["register"]


def register(layers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = layers.add_parser(
        "serve",
        help="serve a model with SGLang (CPU or CUDA)",
        description="Launch SGLang's HTTP server (/generate, /v1/completions) on a model "
        "directory. --device cpu runs SGLang's CPU engine with the flags and stand-ins it "
        "needs; everything after -- is passed to sglang.launch_server.",
    )
    s.add_argument("--model", type=Path, required=True, help="a model directory (config.json)")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument(
        "--device", default=None, help="cpu or cuda (default: cuda where a GPU exists, else cpu)"
    )
    s.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16 or float16 (default: as brisk decode, bfloat16 on a GPU, "
        "float32 on the CPU)",
    )
    add_mask_argument(s)
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command and the variables it sets; start nothing",
    )
    s.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help="a DFlash drafter checkpoint for the model: its blocks verified by the model "
        "(SGLang algorithm BRISK_DRAFTER; greedy answers are the model's greedy decoding); "
        "--temperature, --top-k and --seed apply to it",
    )
    s.add_argument(
        "sglang_args", nargs=argparse.REMAINDER, help="-- then arguments for sglang.launch_server"
    )
    isd = s.add_argument_group(
        "ISD (SGLang algorithm BRISK_ISD)",
        "--stride turns ISD on; the other options need it (--drafter takes --temperature, "
        "--top-k and --seed). Every request must ask for the server's temperature.",
    )
    add_config_arguments(
        isd,
        BriskISDOptions,
        dest_prefix="isd_",
        negatable=False,
        defaults={"stride": "plain autoregressive decoding"},
    )
    s.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    from brisk.runtime.serving.launch import server_launch
    from brisk.runtime.serving.process import port_in_use

    extra = list(args.sglang_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if not (args.model / "config.json").is_file():
        raise ValueError(f"--model: {args.model} is not a model directory (no config.json)")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port: {args.port} is not a port number")
    if not args.dry_run and importlib.util.find_spec("sglang") is None:
        raise ValueError(
            f"SGLang is not installed beside this brisk ({sys.executable}); run "
            "brisk serve from the serving venv (make serving-venv; .venv-serving/bin/brisk serve)"
        )
    if not args.dry_run and port_in_use(args.host, args.port):
        raise ValueError(f"--port: {args.host}:{args.port} is already in use")
    plugin = _plugin_config(args)
    device, dtype = _placement(args)
    with flag_errors({"model", "drafter"}):  # the checkpoint's architecture or drafter
        launch = server_launch(
            args.model,
            args.port,
            device=device,
            dtype=dtype,
            host=args.host,
            extra_args=extra,
            isd=plugin if args.drafter is None else None,
            drafter=plugin if args.drafter is not None else None,
            overrides=_mask(args),
        )
    print(launch.shell(), file=sys.stderr if not args.dry_run else sys.stdout, flush=True)
    if args.dry_run:
        return 0
    os.execve(launch.argv[0], list(launch.argv), dict(launch.env))


def _placement(args: argparse.Namespace) -> tuple[Literal["cpu", "cuda"], str]:
    """``--device`` and ``--dtype`` as ``brisk decode`` resolves them (the default said once on
    stderr; a device that is not here or a dtype it cannot run is one line naming the flag),
    for SGLang, which runs on the CPU or the GPUs it is given (not one chosen by index)."""
    if args.device not in (None, "auto", "cpu", "cuda"):
        raise ValueError(
            f"--device: brisk serve runs on cpu or cuda, got {args.device!r} (choose the GPU "
            "with CUDA_VISIBLE_DEVICES, or pass -- --base-gpu-id N)"
        )
    from brisk.runtime.loader import placement

    where = placement(args.device, args.dtype)
    return ("cuda" if where.device.type == "cuda" else "cpu"), where.dtype_name


def _mask(args: argparse.Namespace) -> dict[str, object] | None:
    """``--mask-token-id`` checked as every command checks it
    (:func:`brisk.runtime.loader.checkpoint_mask_id`: inside the vocabulary, no special token
    the model uses), as the model config's ``mask_token_id``."""
    if args.mask_token_id is None:
        return None
    from brisk.runtime.loader import checkpoint_mask_id

    return {"mask_token_id": checkpoint_mask_id(args.model, args.mask_token_id)}


def _plugin_config(args: argparse.Namespace) -> dict[str, object] | None:
    """The options of the algorithm the flags ask for, those given (the server reads the rest
    from the options' defaults): ``BRISK_ISD``'s with ``--stride``, ``BRISK_DRAFTER``'s with
    ``--drafter`` (the drafter and the flags of the fields its options have); None for plain
    decoding. Checked here, one line naming the flag, so a bad value never reaches SGLang's
    start-up."""
    given = config_overrides(args, BriskISDOptions, "isd_")
    for name in ("corrector", "log_blocks"):  # SGLang's processes may resolve them elsewhere
        if name in given:
            given[name] = str(Path(given[name]).resolve())
    cls: type[ServedOptions] = BriskISDOptions
    if args.drafter is not None:
        if "stride" in given:
            raise ValueError(
                "--drafter: a server decodes with ISD (--stride) or a drafter, not both"
            )
        served = [f.name for f in dataclasses.fields(BriskDrafterOptions) if f.name != "drafter"]
        other = [name for name in given if name not in served]
        if other:
            flags = [_flag(name) for name in served]
            apply = f"{', '.join(flags[:-1])} and {flags[-1]}"
            raise ValueError(f"{_flag(other[0])}: an ISD option; with --drafter only {apply} apply")
        cls, given = BriskDrafterOptions, {"drafter": str(args.drafter), **given}
    elif "stride" not in given:
        if given:
            raise ValueError(f"{_flag(next(iter(given)))}: needs --stride (ISD decoding)")
        return None
    with flag_errors():
        cls.from_mapping(given)
    return given


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
