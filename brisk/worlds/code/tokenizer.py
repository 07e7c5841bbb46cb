"""The code world's tokenizer: byte-level BPE trained on the corpus's training split.

Trained with the ``tokenizers`` library (GPT-2's byte-level pre-tokenizer and decoder, no prefix
space, no normalizer), so any text, non-ASCII and odd whitespace included, decodes back to itself
byte for byte. Ids 0..3 are the specials ``<|pad|>``, ``<|bos|>``, ``<|eos|>`` and ``<|MASK|>``
(the MASK token :mod:`brisk.runtime.backbone` and the loader look up), then the 256 byte symbols,
then the merges, ``vocab_size`` in all.

Wrapped as a transformers ``PreTrainedTokenizerFast`` that ``AutoTokenizer.from_pretrained(dir,
local_files_only=True)`` loads. Like the arithmetic world's character tokenizer, encoding with
special tokens puts BOS first (a post-processor in ``tokenizer.json``, so every consumer of the
saved tokenizer adds it), :func:`brisk.runtime.prompts.encode_prompt` gives the same ids, and
``add_special_tokens=False`` encodes the text alone.

Training takes seconds on a slice and about a minute on the whole stdlib with one thread, so
:func:`code_tokenizer` keeps what it trains in a cache folder (``$BRISK_CACHE``, else
``$XDG_CACHE_HOME/brisk``, else ``~/.cache/brisk``) keyed by the corpus's file list, its settings,
the vocabulary size and the interpreter, with the corpus's provenance saved beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisk._atomic import atomic_write
from brisk.runtime.presets import dlm_tokenizer
from brisk.worlds.code.corpus import CorpusConfig, documents, provenance, python_files

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "BOS",
    "EOS",
    "MASK",
    "PAD",
    "PROVENANCE",
    "SPECIALS",
    "cache_root",
    "check_mask",
    "code_tokenizer",
    "load_tokenizer",
    "train_tokenizer",
    "wrap",
]

PAD, BOS, EOS, MASK = "<|pad|>", "<|bos|>", "<|eos|>", "<|MASK|>"
SPECIALS = (PAD, BOS, EOS, MASK)
PROVENANCE = "corpus_provenance.json"  # saved beside the tokenizer's files
_VERSION = 1  # of the recipe below: a change makes new cache keys


def _backend(vocab_size: int, texts: Iterator[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    return backend


def wrap(backend: Any) -> PreTrainedTokenizerFast:
    """A ``tokenizers.Tokenizer`` as the transformers tokenizer brisk loads (module
    docstring)."""
    return dlm_tokenizer(
        backend,
        pad=PAD,
        bos=BOS,
        eos=EOS,
        mask=MASK,
        clean_up_tokenization_spaces=False,  # decoding gives the bytes back, spaces untouched
    )


def train_tokenizer(cfg: CorpusConfig, vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Byte-level BPE of ``vocab_size`` tokens trained on the training split of ``cfg``."""
    if vocab_size < len(SPECIALS) + 256:
        raise ValueError(f"vocab_size: need ≥ {len(SPECIALS) + 256} (specials and bytes)")
    texts = (doc.text for doc in documents(cfg, "train"))
    return wrap(_backend(vocab_size, texts))


def check_mask(tokenizer: Any, where: str) -> int:
    """The id of ``<|MASK|>`` in ``tokenizer``; a tokenizer without it (as its mask token) is a
    ``ValueError`` naming ``where``."""
    mask_id = tokenizer.convert_tokens_to_ids(MASK)
    if getattr(tokenizer, "mask_token", None) != MASK or not isinstance(mask_id, int):
        raise ValueError(f"tokenizer: {where} has no {MASK} mask token (a DLM needs one)")
    if mask_id == getattr(tokenizer, "unk_token_id", None):
        raise ValueError(f"tokenizer: {where} has no {MASK} mask token (a DLM needs one)")
    return mask_id


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A saved tokenizer, which must hold ``<|MASK|>`` as its mask token (errors name
    ``path``)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise ValueError(f"tokenizer: {path} is not a directory")
    loaded: PreTrainedTokenizerFast = AutoTokenizer.from_pretrained(path, local_files_only=True)
    check_mask(loaded, str(path))
    return loaded


def cache_root() -> Path:
    """Where trained tokenizers are kept (module docstring)."""
    if os.environ.get("BRISK_CACHE"):
        return Path(os.environ["BRISK_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "brisk"


def _key(cfg: CorpusConfig, vocab_size: int) -> str:
    files = "\n".join(python_files(cfg))
    what = {
        "files": hashlib.sha256(files.encode("utf-8")).hexdigest(),
        "root": str(cfg.path.resolve()),
        "config": cfg.to_dict(),
        "vocab_size": vocab_size,
        "interpreter": platform.python_version(),
        "recipe": _VERSION,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def code_tokenizer(
    vocab_size: int = 4096, corpus: CorpusConfig | None = None, cache: Path | None = None
) -> PreTrainedTokenizerFast:
    """The tokenizer of ``vocab_size`` on ``corpus`` (default: the whole stdlib), loaded from
    ``cache`` (default :func:`cache_root`) or trained and saved there with the corpus's
    provenance (:data:`PROVENANCE`)."""
    cfg = corpus if corpus is not None else CorpusConfig()
    folder = (cache or cache_root()) / f"code-tokenizer-{vocab_size}-{_key(cfg, vocab_size)}"
    if (folder / PROVENANCE).is_file():
        return load_tokenizer(folder)
    tokenizer = train_tokenizer(cfg, vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    record = {**provenance(cfg), "vocab_size": len(tokenizer)}
    text = json.dumps(record, indent=1) + "\n"
    # the provenance last: a folder with it holds a whole tokenizer
    atomic_write(folder / PROVENANCE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return tokenizer
