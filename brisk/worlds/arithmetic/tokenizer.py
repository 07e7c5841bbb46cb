"""A character-level tokenizer: one token per printable ASCII character, plus four specials.

Built with the ``tokenizers`` library (word-level model over single characters, a pre-tokenizer
that isolates every character, a fusing decoder so decoding concatenates) and wrapped as a
transformers ``PreTrainedTokenizerFast`` so it saves and loads with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` like any checkpoint's tokenizer.

Its models are trained on ``[bos, prompt, response, eos]``, so encoding with special tokens
(``tokenizer(text)``, ``encode(text)``) puts BOS first, as Llama's tokenizers do: a post-processor
in ``tokenizer.json`` (``<|bos|> $A``) that every consumer of the saved tokenizer applies, SGLang's
tokenizer manager among them, so a text prompt sent to a server gets the ids
:func:`brisk.runtime.prompts.encode_prompt` gives ``brisk decode``. ``add_special_tokens=False``
encodes the text alone.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from brisk.runtime.presets import dlm_tokenizer

__all__ = ["BOS", "EOS", "MASK", "PAD", "UNK", "char_tokenizer"]

PAD, BOS, EOS, MASK, UNK = "<|pad|>", "<|bos|>", "<|eos|>", "<|MASK|>", "<|unk|>"
SPECIALS = (PAD, BOS, EOS, MASK, UNK)
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def char_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer; ids 0..4 are pad, bos, eos, ``<|MASK|>``, unk, then one per character.

    >>> tok = char_tokenizer()
    >>> ids = tok.encode("7+5=12\\n")  # BOS (id 1) first
    >>> ids[0], tok.decode(ids, skip_special_tokens=True) == "7+5=12\\n", len(ids)
    (1, True, 8)
    >>> len(tok.encode("7+5=12\\n", add_special_tokens=False))
    7
    """
    vocab = {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return dlm_tokenizer(backend, pad=PAD, bos=BOS, eos=EOS, mask=MASK, unk_token=UNK)
