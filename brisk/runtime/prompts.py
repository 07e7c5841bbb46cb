"""The tokenizer's side of decoding: prompt text in, completion text out, as ``brisk decode`` does.

:func:`brisk.runtime.isd.decode` works on token ids and stops only at the EOS id it is given.
A base model trained on ``[bos, prompt, response, eos]`` (the tiny world, I-DLM) decodes noise
from a prompt without its BOS and never stops without its EOS, so the Python API goes through
the same three helpers as the command line:

>>> from brisk.runtime.presets import preset_tokenizer
>>> tokenizer = preset_tokenizer("tiny")  # the tiny world's character tokenizer
>>> encode_prompts(tokenizer, ["1+2"])  # BOS (id 1) first
[[1, 23, 17, 24]]
>>> isd_options(tokenizer, stride=8).eos_token_id, isd_options(tokenizer, stride=8).M
(2, 7)
>>> completion_text(tokenizer, [23, 17, 24, 2])  # cut at EOS (id 2)
'1+2'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.result import DecodeResult

__all__ = ["completion_text", "completion_texts", "encode_prompt", "encode_prompts", "isd_options"]


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` behind the tokenizer's BOS (when it has one and the text does not
    already start with it); no other special tokens are added."""
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    bos = tokenizer.bos_token_id
    return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids


def encode_prompts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """:func:`encode_prompt` of each text: the ``prompts`` argument of ``decode``."""
    if isinstance(texts, str):
        raise TypeError("texts: expected a sequence of prompts, got one string")
    return [encode_prompt(tokenizer, t) for t in texts]


def isd_options(tokenizer: PreTrainedTokenizerBase, **options: Any) -> ISDOptions:
    """:class:`ISDOptions` (keyword arguments as there) that stop at the tokenizer's EOS unless
    ``eos_token_id`` is given."""
    options.setdefault("eos_token_id", tokenizer.eos_token_id)
    return ISDOptions(**options)


def completion_text(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int]) -> str:
    """The text of one request's output tokens, the EOS that ended it left out."""
    eos = tokenizer.eos_token_id
    return str(tokenizer.decode([t for t in tokens if t != eos]))


def completion_texts(tokenizer: PreTrainedTokenizerBase, result: DecodeResult) -> list[str]:
    """:func:`completion_text` of every request of a ``decode`` result, in prompt order."""
    return [completion_text(tokenizer, tokens) for tokens in result.tokens]
