"""A character-level tokenizer: one token per printable ASCII character, plus four specials.

Built with the ``tokenizers`` library (word-level model over single characters, a pre-tokenizer
that isolates every character, a fusing decoder so decoding concatenates) and wrapped as a
transformers ``PreTrainedTokenizerFast`` so it saves and loads with ``save_pretrained`` /
``AutoTokenizer.from_pretrained`` like any checkpoint's tokenizer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

__all__ = ["BOS", "EOS", "MASK", "PAD", "UNK", "char_tokenizer"]

PAD, BOS, EOS, MASK, UNK = "<|pad|>", "<|bos|>", "<|eos|>", "<|MASK|>", "<|unk|>"
SPECIALS = (PAD, BOS, EOS, MASK, UNK)
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


def char_tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer; ids 0..4 are pad, bos, eos, ``<|MASK|>``, unk, then one per character.

    >>> tok = char_tokenizer()
    >>> ids = tok.encode("7+5=12\\n")
    >>> tok.decode(ids) == "7+5=12\\n", len(ids)
    (True, 7)
    """
    vocab = {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        mask_token=MASK,
        add_bos_token=False,
        add_eos_token=False,
    )
