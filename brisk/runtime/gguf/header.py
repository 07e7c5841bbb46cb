"""The header of a GGUF file (llama.cpp's format), read and checked: what the file says of itself.

A GGUF file holds its config as metadata under llama.cpp's key names, its tensors' types, and
its tokenizer as ``tokenizer.ggml.*`` keys: the vocabulary in id order, the merges, the special
ids. :func:`read_gguf_header` reads them with the ``gguf`` package and refuses, each as one
``ValueError`` naming the file, what :func:`brisk.runtime.gguf.convert_gguf` cannot convert: a
file that is not GGUF, a truncated or corrupt one, an architecture transformers cannot read
from GGUF as a causal LM (:func:`supported_architectures`), a tensor type no dequantizer reads
(``gguf.quants``) and a file without a tokenizer.

``gguf`` and transformers are imported on call.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["MAGIC", "GGUFHeader", "one_line", "read_gguf_header", "supported_architectures"]

MAGIC = b"GGUF"
"""The four bytes a GGUF file starts with."""

_FLOAT_TYPES = ("F32", "F16", "BF16")
# transformers' GGUF loader renames these llama.cpp architectures to its model types
# (load_gguf_checkpoint); the rest are spelled alike.
_ALIASES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
}
_SPECIAL_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF file says of itself: its architecture, its tensors' types, its tokenizer."""

    path: Path
    architecture: str
    tensor_types: dict[str, int]
    """ggml type name (``Q4_1``, ``F32``) → how many tensors the file stores in it."""
    tokenizer_model: str
    """``tokenizer.ggml.model``: ``gpt2`` (byte-level BPE), ``llama`` (SentencePiece) …"""
    tokens: tuple[str, ...] = field(repr=False)
    """The vocabulary in id order (``tokenizer.ggml.tokens``)."""
    special_ids: dict[str, int]
    """``bos``, ``eos``, ``unk``, ``pad`` → id, where the file names one."""

    @property
    def quantized(self) -> list[str]:
        """The block-quantized types among the tensors' (``["Q4_1", "Q8_0"]``)."""
        return sorted(t for t in self.tensor_types if t not in _FLOAT_TYPES)


def supported_architectures() -> list[str]:
    """The GGUF architectures (``general.architecture``, as llama.cpp spells them) that
    :func:`convert_gguf` converts: those the installed transformers reads from a GGUF file as a
    causal LM."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # The legacy table's keys include its "general" and "tokenizer" sections.
    names = {a for a in GGUF_SUPPORTED_ARCHITECTURES if a in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES}
    try:  # transformers ≥ 5.x reads some architectures on a second path, each a causal LM
        from transformers.integrations.gguf import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    except ImportError:
        pass
    # in llama.cpp's spelling, the one a file holds
    return sorted(
        {gguf for gguf, hf in _ALIASES.items() if hf in names} | names - {*_ALIASES.values()}
    )


def read_gguf_header(file: str | os.PathLike[str]) -> GGUFHeader:
    """The header of the GGUF ``file``, checked: every error is one ``ValueError`` naming it (not
    a GGUF file, truncated or corrupt, an unsupported architecture or tensor type, no
    tokenizer)."""
    import gguf

    path = Path(file)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    size = path.stat().st_size
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it does not start with {MAGIC!r})")
    try:
        reader = gguf.GGUFReader(path)
        fields = {key: _field_value(f) for key, f in reader.fields.items()}
        tensors = [
            (t.name, int(t.tensor_type), int(t.data_offset), int(t.n_bytes)) for t in reader.tensors
        ]
    except Exception as err:  # the reader meets damage with any of several exception types
        raise ValueError(f"{path} is truncated or corrupt: {one_line(err)}") from None
    for name, _, offset, nbytes in tensors:
        if offset + nbytes > size:
            raise ValueError(
                f"{path} is truncated: tensor {name} ends at byte {offset + nbytes}, the file "
                f"has {size}"
            )
    if not tensors:
        raise ValueError(f"{path} holds no tensors")

    architecture = str(fields.get("general.architecture", ""))
    supported = supported_architectures()
    if architecture not in supported:
        raise ValueError(
            f"{path}: architecture {architecture!r} is not one transformers reads from GGUF as a "
            f"causal LM ({', '.join(supported)})"
        )
    types = Counter(_type_name(ggml_type) for _, ggml_type, _, _ in tensors)
    unreadable = sorted(name for name in types if not _dequantizable(name))
    if unreadable:
        raise ValueError(
            f"{path}: tensor type {', '.join(unreadable)} has no dequantizer in the gguf package "
            f"(it reads {', '.join([*_FLOAT_TYPES, *_readable_types()])})"
        )
    tokens = fields.get("tokenizer.ggml.tokens")
    model = fields.get("tokenizer.ggml.model")
    if not isinstance(tokens, list) or not tokens or not isinstance(model, str):
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens and .model)")
    special = {}
    for name, key in _SPECIAL_KEYS.items():
        if key in fields:
            value = fields[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{path}: {key} is not a token id ({value!r:.40})")
            special[name] = value
    for name, token_id in special.items():
        if not 0 <= token_id < len(tokens):
            raise ValueError(
                f"{path}: {_SPECIAL_KEYS[name]} = {token_id} is outside its {len(tokens)}-token "
                "vocabulary"
            )
    return GGUFHeader(path, architecture, dict(types), model, tuple(map(str, tokens)), special)


def _field_value(f: Any) -> Any:
    """A metadata field's value from the reader's parts (the reader's own ``contents()`` is
    newer than gguf 0.10): a number, a string, or a list of either."""
    import gguf

    kinds = list(f.types)
    if not kinds:
        return None
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        if len(kinds) < 2:
            return []
        if kinds[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if kinds[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def _type_name(ggml_type: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


@cache
def _dequantizable(name: str) -> bool:
    """Whether gguf's ``dequantize`` (what transformers' GGUF loader calls) reads ``name``:
    asked with one zero block, since the package lists its readers nowhere public."""
    import gguf
    import numpy as np

    if name in _FLOAT_TYPES:
        return True
    try:
        qtype = gguf.GGMLQuantizationType[name]
        _, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        gguf.quants.dequantize(np.zeros((1, nbytes), dtype=np.uint8), qtype)
    except (KeyError, NotImplementedError, ValueError):
        return False
    return True


def _readable_types() -> list[str]:
    import gguf

    return [
        t.name
        for t in gguf.GGMLQuantizationType
        if t in gguf.GGML_QUANT_SIZES and t.name not in _FLOAT_TYPES and _dequantizable(t.name)
    ]


def one_line(err: BaseException) -> str:
    """``err`` as one line (its type's name when it says nothing)."""
    return " ".join(str(err).split()) or type(err).__name__
