"""Checks of a checkpoint's weight files before they load: one line naming the file and what is
wrong with it.

A damaged checkpoint loaded through transformers or safetensors ends in a long traceback that
often does not name the file ("incomplete metadata, file not fully covered"). The safetensors
format puts every tensor's name, dtype, shape and byte range in a header, and its reader checks
that the ranges cover the file exactly, so reading the headers alone (no tensor data) finds a
truncated file, a file that is not safetensors, and, against the tensors the config implies, a
tensor of the wrong shape or a missing one. Corrupted bytes inside a tensor of the right size are
beyond what the format can tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["check_model_weights", "check_shapes", "tensor_shapes"]

Shapes = dict[str, tuple[int, ...]]


def tensor_shapes(file: str | Path) -> Shapes:
    """Name → shape of every tensor in a safetensors file, from its header alone; a file that
    is missing, truncated or not safetensors is a :class:`ValueError` naming it."""
    from safetensors import SafetensorError, safe_open

    path = Path(file)
    if not path.is_file():
        raise ValueError(f"{path}: no such weights file")
    try:
        with safe_open(path, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as err:
        detail = " ".join(str(err).split())
        raise ValueError(
            f"{path}: not a readable safetensors file ({detail}): truncated, or not safetensors"
        ) from None


def check_shapes(
    file: str | Path, found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]]
) -> None:
    """Every tensor ``expected`` holds must be in ``found`` with its shape (names that only
    ``found`` holds are left to the loader)."""
    for name, shape in expected.items():
        if name not in found:
            raise ValueError(f"{file}: no tensor {name!r} (the config needs one of shape {shape})")
        if tuple(found[name]) != tuple(shape):
            raise ValueError(
                f"{file}: tensor {name!r} has shape {list(found[name])}, the config needs "
                f"{list(shape)}"
            )


def check_model_weights(path: str | Path, config: Any, trust_remote_code: bool = False) -> None:
    """Check a transformers checkpoint directory's safetensors files against its ``config``.

    Every ``*.safetensors`` file must be readable; a tensor that the model built from the
    config also has must have its shape. Tied or renamed parameters that the files do not hold
    under the model's own name are left to transformers, and so are checkpoints in other
    formats.
    """
    import torch
    from transformers import AutoModelForCausalLM

    files = sorted(Path(path).glob("*.safetensors"))
    found = {f: tensor_shapes(f) for f in files}
    if not files:
        return
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError):
        return  # a model class transformers cannot build: its loader says what is wrong
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for file, shapes in found.items():
        check_shapes(file, shapes, {k: v for k, v in expected.items() if k in shapes})
