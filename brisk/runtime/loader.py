"""One loader for every command and library entry point that runs a model.

A ``.gguf`` file stands for the checkpoint directory it converts to
(:func:`brisk.runtime.gguf.checkpoint_dir`: once, cached), wherever a directory is taken.

A checkpoint directory becomes a tokenizer, a :class:`~brisk.runtime.backbone.HFBackbone`
(weights on the device, in the dtype, with the attention implementation asked for) and a MASK
id, by the same rules wherever it is loaded: ``brisk decode``, self-generation, event
collection, corrector training, evaluation, both experiments, the memory benchmark. A second
copy with other defaults is how a GPU run ends up on the CPU in fp32.

**Where and in what.** :func:`placement` resolves ``--device`` / ``--dtype``. The default is
the GPU in bfloat16 where CUDA exists and the CPU in float32 otherwise, said once per process
on stderr; ``brisk serve`` passes the same default to SGLang. A device that is not there, and a
dtype the device cannot run, are a ``ValueError`` naming the flag.

**The MASK id** (:func:`checkpoint_mask_id`, every command through it): ``--mask-token-id`` or a
config's ``mask_token_id``, else the tokenizer's mask token, else the checkpoint config's
``mask_token_id`` (I-DLM checkpoints: 151669), else the tokenizer's ``<|MASK|>``; checked to lie
inside the embedding rows and to be no special token the model uses (bos, eos, pad, its chat
template's), one line naming ``--mask-token-id`` otherwise
(:func:`brisk.runtime.backbone.resolve_mask_id` has the order and the checks). A checkpoint
without a MASK token takes ``--mask-token-id`` (an id it never uses), or, trained from with
``--add-mask-token``, gets a row of its own.

The stride and the token budget are fitted to the model's positions by
:func:`brisk.runtime.decode_options.fit_budget`, beside the requests every loop checks.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from brisk._json import read_json_object
from brisk.runtime.gguf import checkpoint_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from brisk.runtime.backbone import HFBackbone

__all__ = [
    "DTYPES",
    "LoadedModel",
    "Placement",
    "checkpoint_mask_id",
    "default_placement",
    "load_model",
    "load_target",
    "load_tokenizer",
    "placement",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The dtypes a model runs in, by the names the flags take (``fp32``, ``bf16``, ``fp16`` too)."""

_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "auto": ""}


@dataclass(frozen=True)
class Placement:
    """Where a model runs and in what dtype."""

    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        """The dtype as the flags and SGLang's ``--dtype`` spell it (``bfloat16``)."""
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype)

    @property
    def precision(self) -> str:
        """The training precision this placement computes in: ``bf16`` or ``fp32``."""
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"

    def __str__(self) -> str:
        return f"{self.device} in {self.dtype_name}"


def default_placement() -> Placement:
    """CUDA (the current device) in bfloat16 where a GPU exists, else the CPU in float32."""
    if torch.cuda.is_available():
        return Placement(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16)
    return Placement(torch.device("cpu"), torch.float32)


_announced = False


def placement(
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    *,
    announce: bool = True,
) -> Placement:
    """``--device`` and ``--dtype`` resolved and checked (None, ``""`` or ``"auto"``: the default
    of :func:`default_placement`; a dtype given alone keeps the default device, a device given
    alone runs in float32 on the CPU and bfloat16 on a GPU). When a default was taken on a
    machine with a GPU (where the choice is a real one: memory, bf16 numerics) it is said once
    per process on stderr (``announce``); a CPU-only machine runs on the CPU in float32, as
    always, silently.

    >>> placement("cpu", "bf16", announce=False)
    Placement(device=device(type='cpu'), dtype=torch.bfloat16)
    >>> placement("cpu", "half", announce=False)
    Traceback (most recent call last):
    ValueError: --dtype: expected float32, bfloat16 or float16, got 'half'
    """
    default = default_placement()
    chosen_device = default.device if device in (None, "", "auto") else _device(device)
    if dtype in (None, "", "auto"):
        chosen_dtype = torch.float32 if chosen_device.type == "cpu" else torch.bfloat16
    else:
        chosen_dtype = _dtype(dtype)
    result = Placement(chosen_device, chosen_dtype)
    _check_runs(result)
    defaulted = device in (None, "", "auto") or dtype in (None, "", "auto")
    global _announced
    if announce and defaulted and torch.cuda.is_available() and not _announced:
        _announced = True
        print(f"brisk: running on {result} (--device and --dtype choose)", file=sys.stderr)
    return result


def _device(name: str | torch.device) -> torch.device:
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"--device: {name!r} is not a torch device (cpu, cuda, cuda:1, mps)"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device: {name} requested, but CUDA is not available here")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device: {name} requested, but there are {count} CUDA devices")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device: {name} requested, but MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device: {name} is not one brisk runs on (cpu, cuda, mps)")
    return device


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"--dtype: expected float32, bfloat16 or float16, got {name}")
        return name
    key = _ALIASES.get(str(name), str(name))
    if key not in DTYPES:
        raise ValueError(f"--dtype: expected float32, bfloat16 or float16, got {name!r}")
    return DTYPES[key]


def _check_runs(where: Placement) -> None:
    """Refuse a dtype the device cannot compute in (bfloat16 on a GPU before Ampere, any dtype
    a matrix product refuses), naming the flag."""
    name = where.dtype_name
    cuda_bf16 = where.device.type == "cuda" and where.dtype == torch.bfloat16
    if cuda_bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        gpu = torch.cuda.get_device_name(where.device)
        raise ValueError(
            f"--dtype: {gpu} ({where.device}) has no bfloat16 arithmetic; use float16 or float32"
        )
    try:
        a = torch.ones(2, 2, device=where.device, dtype=where.dtype)
        torch.nn.functional.softmax(a @ a, dim=-1)
    except RuntimeError as err:
        first = str(err).splitlines()[0]
        raise ValueError(f"--dtype: {name} does not run on {where.device} ({first})") from None


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint as decoding and evaluation use it."""

    path: Path
    tokenizer: Any  # PreTrainedTokenizerBase
    backbone: HFBackbone
    placement: Placement

    @property
    def mask_token_id(self) -> int:
        return self.backbone.mask_token_id

    @property
    def model(self) -> Any:
        """The transformers model under the backbone."""
        return self.backbone.model


def load_model(
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    mask_token_id: int | None = None,
    trust_remote_code: bool = False,
    attention: str | None = None,
    where: str = "--model",
    announce: bool = True,
    need_mask: bool = True,
) -> LoadedModel:
    """Tokenizer and backbone of the checkpoint at ``path`` on ``device`` in ``dtype``
    (:func:`placement`; the weights are read straight into that dtype), in eval mode, with
    the attention implementation ``attention`` (None: sdpa where transformers has it).

    Errors are one ``ValueError`` naming the flag ``where`` (``--model``, ``--checkpoint``), or
    ``--mask-token-id`` when the checkpoint defines no MASK token, or ``--device`` / ``--dtype``.
    A caller that never reads the MASK id (plain decoding, ``need_mask=False``) loads a
    checkpoint that defines none; row 0 then stands in as the backbone's unused MASK id.
    """
    from brisk._hf import quiet_transformers
    from brisk.runtime.backbone import HFBackbone

    on = placement(device, dtype, announce=announce)
    directory = checkpoint_dir(path, where)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{where}: {directory} is not a checkpoint directory (no config.json)")
    quiet_transformers()
    tokenizer = load_tokenizer(directory, trust_remote_code=trust_remote_code, where=where)
    try:
        mask_id = checkpoint_mask_id(
            directory,
            mask_token_id,
            tokenizer=tokenizer,
            trust_remote_code=trust_remote_code,
            where=where,
        )
    except ValueError:
        if need_mask or mask_token_id is not None:
            raise
        mask_id = None
    try:
        backbone = HFBackbone.from_pretrained(
            directory,
            mask_token_id=mask_id,
            trust_remote_code=trust_remote_code,
            dtype=on.dtype,
            device=on.device,
            attention=attention,
            need_mask=need_mask,
        )
    except ValueError as err:
        raise ValueError(f"{where}: {_one_line(err).removeprefix('path: ')}") from None
    except OSError as err:
        raise ValueError(f"{where}: {_one_line(err)}") from None
    return LoadedModel(directory, tokenizer, backbone, on)


def checkpoint_mask_id(
    path: str | Path,
    given: int | None = None,
    *,
    tokenizer: Any = None,
    unused_row: bool = False,
    trust_remote_code: bool = False,
    where: str = "--model",
) -> int:
    """The MASK id of the checkpoint at ``path`` (module docstring), read from its tokenizer
    (``tokenizer``, else the one saved there, if any) and its config, before any weight is
    loaded: a
    bad id stops a command before it writes anything. ``given`` is ``--mask-token-id`` or a
    config's ``mask_token_id``; ``unused_row``: where nothing defines one, the first embedding
    row no token uses (DFlash's choice for a drafter's MASK). Errors are one ``ValueError``
    naming ``--mask-token-id``, or ``where`` for a config that cannot be read."""
    from brisk.runtime.architectures import model_config
    from brisk.runtime.backbone import resolve_mask_id

    if tokenizer is None:
        with contextlib.suppress(ValueError):  # none saved: the config alone decides
            tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code, where=where)
    try:
        config = model_config(path, trust_remote_code)
    except (OSError, ValueError) as err:
        raise ValueError(f"{where}: {_one_line(err).removeprefix('path: ')}") from None
    rows = int(config.get_text_config().vocab_size)  # a multimodal config keeps it in text_config
    fallback = None
    if unused_row and tokenizer is not None and len(tokenizer) < rows:
        fallback = len(tokenizer)
    return resolve_mask_id(tokenizer, config, given, rows=rows, fallback=fallback, source=str(path))


def load_tokenizer(
    path: str | Path, *, trust_remote_code: bool = False, where: str = "--model"
) -> PreTrainedTokenizerBase:
    """The tokenizer of the checkpoint at ``path``, read from disk only; a missing or unreadable
    one is a ``ValueError`` naming the flag ``where``."""
    from transformers import AutoTokenizer

    directory = checkpoint_dir(path, where)
    check_json_files(directory, where)
    try:
        tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            directory, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError) as err:
        raise ValueError(f"{where}: no tokenizer in {path}: {_one_line(err)}") from None
    except (KeyError, TypeError, AttributeError) as err:  # a well-formed file of another schema
        file = directory / "tokenizer.json"
        named = file if file.is_file() else directory
        raise ValueError(
            f"{where}: {named}: not a tokenizer transformers reads "
            f"({type(err).__name__}: {_one_line(err)})"
        ) from None
    return tokenizer


# the JSON files of a checkpoint directory that transformers reads as objects
JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def load_target(
    path: str | Path,
    where: str = "--target",
    device: str | torch.device = "cpu",
    mask_token_id: int | None = None,
) -> tuple[Any, Any, int]:
    """The frozen target, its tokenizer and the MASK id its drafter uses
    (:func:`checkpoint_mask_id`, checked before the weights load:
    ``mask_token_id``, else the target's own, else the first embedding row no token uses,
    DFlash's choice for Qwen3); one line naming ``--mask-token-id`` when there is none."""
    from brisk.runtime.architectures import load_causal_lm

    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{where}: {directory} is not a checkpoint directory (no config.json)")
    tokenizer = load_tokenizer(directory, where=where)
    mask = checkpoint_mask_id(
        directory, mask_token_id, tokenizer=tokenizer, unused_row=True, where=where
    )
    target = load_causal_lm(directory, False, torch.float32).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target, tokenizer, mask


def check_json_files(directory: Path, where: str = "--model") -> None:
    """Each of :data:`JSON_FILES` present in ``directory`` is UTF-8 JSON holding an object, or a
    ``ValueError`` naming ``where`` and the file (transformers answered a list with a
    ``TypeError`` traceback, an object without its keys with a ``KeyError``)."""
    for name in JSON_FILES:
        file = Path(directory) / name
        if not file.is_file():
            continue
        try:
            read_json_object(file)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def training_placement(
    device: str, precision: str, *, distributed: bool
) -> tuple[torch.device, str]:
    """Where a training process runs and the precision it computes in: ``device`` as
    :func:`placement` resolves it (``auto``: the GPU where one exists); under torchrun
    (``distributed``) each rank takes its own GPU, ``cuda:LOCAL_RANK``, when CUDA exists. The
    precision ``auto`` is bf16 on a GPU (bf16 compute, fp32 master weights) and fp32 on the
    CPU."""
    import os

    if distributed and device in ("", "auto", "cuda") and torch.cuda.is_available():
        where = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    elif distributed and device in ("", "auto"):
        where = torch.device("cpu")
    else:
        where = placement(device, "float32", announce=False).device
    if precision not in ("", "auto"):
        return where, precision
    chosen = "bf16" if where.type == "cuda" else "fp32"
    global _announced
    if not _announced and where.type == "cuda" and int(os.environ.get("RANK", "0")) == 0:
        _announced = True
        print(
            f"brisk: training on {where} in {chosen} (--device and --precision choose)",
            file=sys.stderr,
        )
    return where, chosen
