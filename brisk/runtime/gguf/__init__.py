"""GGUF files (llama.cpp's format) as brisk checkpoints.

A GGUF file holds a model's weights, mostly quantized in blocks (Q4_1, Q8_0, K-quants …), its
config as metadata under llama.cpp's key names, and its tokenizer as ``tokenizer.ggml.*`` keys:
the vocabulary in id order, the merges, the special ids, the chat template. brisk runs dense
transformers checkpoints, so :func:`convert_gguf` writes one: transformers reads the file
(``from_pretrained(dir, gguf_file=...)``, which un-permutes llama.cpp's rotary layout of the
query and key weights), every weight is dequantized to ``float32`` (or ``bfloat16``), and the
result is saved as a plain checkpoint directory: ``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer's files with the chat template, and
``gguf_source.json`` saying where it came from. The directory appears whole or not at all.

**The tokenizer is checked against the file.** Converters have set EOS from BOS (transformers
issue #31630) and can shift ids, and a wrong id is silent at decode time. So every id of the
converted tokenizer must spell the token the file lists at that id (byte-level vocabularies in
their byte alphabet, as transformers spells them); a disagreement is refused. A special token
(BOS, EOS, UNK, PAD) that disagrees with the file's ``tokenizer.ggml.*_token_id`` is set from
the file, said on stderr, and the model's config and generation config take the file's ids too.

**What is refused**, each as one ``ValueError`` naming the file, before anything is written:
what the file's header does not allow (:mod:`brisk.runtime.gguf.header`: not GGUF, truncated
or corrupt, an architecture transformers cannot read from GGUF as a causal LM, a tensor type no
dequantizer reads, no tokenizer), and an ``out`` that exists and is not empty.

:func:`checkpoint_dir` is the one call a loader needs to accept a ``.gguf`` path: a directory
passes through, a GGUF file is converted once into a cache (``$BRISK_CACHE/gguf/`` or
``~/.cache/brisk/gguf/``) and that directory returned.

torch and transformers are imported on call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from brisk._atomic import replace_dir
from brisk.runtime.gguf.header import (
    MAGIC,
    GGUFHeader,
    one_line,
    read_gguf_header,
    supported_architectures,
)

__all__ = [
    "DTYPES",
    "GGUFHeader",
    "checkpoint_dir",
    "convert_gguf",
    "fingerprint",
    "read_gguf_header",
    "supported_architectures",
]

DTYPES = ("float32", "bfloat16")
"""The dtypes :func:`convert_gguf` writes."""

SOURCE_FILE = "gguf_source.json"
"""The record a converted directory keeps of its GGUF file."""


def convert_gguf(
    file: str | os.PathLike[str], out: str | os.PathLike[str], *, dtype: str = "float32"
) -> Path:
    """Write the GGUF ``file`` as a transformers checkpoint directory ``out`` in ``dtype``
    (``float32`` or ``bfloat16``), atomically, its tokenizer checked against the file (module
    docstring); returns ``out``. The dequantization is said once on stderr. Bad input is one
    ``ValueError`` naming the file (or ``out``, or ``dtype``), and nothing is written."""
    import torch

    from brisk._hf import quiet_transformers

    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected {' or '.join(DTYPES)}, got {dtype!r}")
    target = Path(out)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ValueError(f"{target} exists and is not empty: the conversion writes a new directory")
    header = read_gguf_header(file)
    source = header.path.resolve()
    quiet_transformers()
    if header.quantized:
        kinds = ", ".join(header.quantized)
        print(f"brisk: dequantizing {kinds} weights of {source.name} to {dtype}", file=sys.stderr)
    model, tokenizer = _load(source, getattr(torch, dtype))
    _check_vocabulary(tokenizer, header)
    for line in _fix_special_tokens(tokenizer, model, header):
        print(f"brisk: {source.name}: {line}", file=sys.stderr)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "file": source.name,
            "bytes": source.stat().st_size,
            "fingerprint": fingerprint(source),
            "architecture": header.architecture,
            "tensor_types": header.tensor_types,
            "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()),
            "tokens": len(header.tokens),
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        _check_saved_tokenizer(tmp, header)
        return replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_dir(path: str | os.PathLike[str], where: str = "--model") -> Path:
    """The checkpoint directory to load for ``path``: a directory (or a path that does not
    exist, for the loader to refuse) as it is; a GGUF file converted once, in float32, into
    ``$BRISK_CACHE/gguf/<stem>-<fingerprint>`` (default ``~/.cache/brisk/gguf/``), that
    directory reused afterwards. Errors name the flag ``where``."""
    given = Path(path)
    if given.is_dir() or not given.exists():
        return given
    with given.open("rb") as f:
        is_gguf = f.read(4) == MAGIC
    if not is_gguf and given.suffix != ".gguf":
        raise ValueError(f"{where}: {given} is neither a checkpoint directory nor a GGUF file")
    root = Path(os.environ["BRISK_CACHE"]) if os.environ.get("BRISK_CACHE") else _home_cache()
    cached = root / "gguf" / f"{given.stem}-{fingerprint(given)}"
    if (cached / "config.json").is_file():
        return cached
    # Converted into a directory of this process's own, then renamed into place: another
    # process converting the same file at once finds the cache complete and keeps its copy.
    mine = cached.with_name(f".{cached.name}.{os.getpid()}")
    try:
        convert_gguf(given, mine)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    try:
        mine.rename(cached)
    except OSError:  # the other process renamed first: its conversion is the same
        shutil.rmtree(mine, ignore_errors=True)
    return cached


def fingerprint(file: str | os.PathLike[str]) -> str:
    """16 hex digits of SHA-256 over the file's size, its first and its last MiB: the header
    (architecture, quantization, tokenizer) and the data at both ends, read in milliseconds
    where hashing a many-GB file whole would take a minute at every load."""
    path = Path(file)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def _home_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "brisk"


def _load(source: Path, dtype: Any) -> tuple[Any, Any]:
    """transformers' own reading of the file: the causal LM dequantized into ``dtype`` with its
    quantizer detached, and the tokenizer. A file transformers fails on is one line naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {}
    try:  # transformers 5 attaches a GGUF quantizer; asked to dequantize, it detaches itself
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=str(source))
        with _no_legacy_bar():
            model = AutoModelForCausalLM.from_pretrained(
                source.parent, gguf_file=str(source), dtype=dtype, local_files_only=True, **kwargs
            )
    except (ValueError, KeyError, OSError, NotImplementedError, RuntimeError, TypeError) as err:
        raise ValueError(f"{source}: transformers cannot read it: {one_line(err)}") from None
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # an older transformers that kept it: save_pretrained refuses
        quantizer.remove_quantization_config(model)
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:  # the file states no tokenizer limit; the model's positions are the one
        tokenizer.model_max_length = positions
    model.eval()
    return model, tokenizer


@contextmanager
def _no_legacy_bar() -> Iterator[None]:
    """Without the tqdm bar transformers' legacy GGUF reader draws on stderr whatever
    ``disable_progress_bar`` says (it imports tqdm itself): the dequantization is said once."""
    from transformers import modeling_gguf_pytorch_utils as legacy

    bar = legacy.tqdm
    legacy.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        legacy.tqdm = bar


def _spelling(header: GGUFHeader) -> list[str]:
    """The file's tokens as transformers' GGUF tokenizer spells them: a byte-level vocabulary's
    tokens outside the byte alphabet in it (``byte_level_tokenizer``), a SentencePiece
    vocabulary's whitespace-only tokens of Gemma as ``▁`` runs (``gemma_tokenizer``)."""
    tokens = list(header.tokens)
    if header.tokenizer_model == "gpt2":
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        spell = bytes_to_unicode()
        alphabet = set(spell.values())
        return [
            t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8"))
            for t in tokens
        ]
    if header.tokenizer_model == "llama" and header.architecture.startswith("gemma"):
        return ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    return tokens


def _check_vocabulary(tokenizer: Any, header: GGUFHeader) -> None:
    """Every id of ``tokenizer`` spells the file's token at that id, and it has no other ids."""
    expected = _spelling(header)
    got = tokenizer.convert_ids_to_tokens(list(range(len(expected))))
    wrong = [i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b]
    if wrong:
        i = wrong[0]
        raise ValueError(
            f"{header.path}: the converted tokenizer disagrees with the file's vocabulary at "
            f"{len(wrong)} of {len(expected)} ids (first: id {i} is {expected[i]!r} in the file, "
            f"{got[i]!r} in the tokenizer)"
        )
    if len(tokenizer) != len(expected):
        raise ValueError(
            f"{header.path}: the converted tokenizer has {len(tokenizer)} ids, the file's "
            f"vocabulary {len(expected)}"
        )


def _fix_special_tokens(tokenizer: Any, model: Any, header: GGUFHeader) -> list[str]:
    """Set every special token the tokenizer, the config or the generation config holds
    otherwise than the file (``tokenizer.ggml.*_token_id``) from the file; returns one line per
    fix."""
    fixes = []
    spelled = _spelling(header)
    generation = getattr(model, "generation_config", None)
    for name, token_id in header.special_ids.items():
        token = spelled[token_id]
        held = getattr(tokenizer, f"{name}_token_id")
        if held != token_id:
            setattr(tokenizer, f"{name}_token", token)
            fixes.append(
                f"the converted tokenizer's {name} token was id {held}; set to the file's "
                f"{token!r} (id {token_id})"
            )
        if name == "unk":  # the tokenizer's alone: no model or generation setting reads it
            continue
        key = f"{name}_token_id"
        for owner, what in ((model.config, "config"), (generation, "generation config")):
            held = getattr(owner, key, None) if owner is not None else token_id
            # an EOS list (several end-of-turn ids) agrees when it holds the file's EOS
            if held != token_id and not (isinstance(held, list) and token_id in held):
                fixes.append(f"the {what}'s {key} was {held}; set to the file's {token_id}")
                setattr(owner, key, token_id)
    return fixes


def _check_saved_tokenizer(directory: Path, header: GGUFHeader) -> None:
    """The tokenizer as a loader will read it back: the file's ids, special ids included."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    _check_vocabulary(tokenizer, header)
    for name, token_id in header.special_ids.items():
        held = getattr(tokenizer, f"{name}_token_id")
        if held != token_id:
            raise ValueError(
                f"{header.path}: the saved tokenizer's {name} token is id {held}, the file's "
                f"{token_id}"
            )
