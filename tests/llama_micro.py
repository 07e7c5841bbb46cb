"""A checkpoint shaped like a user's own AR model: a micro ``LlamaForCausalLM`` (tied
embeddings, as SmolLM2's) with a byte-level BPE tokenizer whose specials are ChatML's
(``<|im_start|>`` bos, ``<|im_end|>`` eos, ``<|endoftext|>`` pad) and which has **no MASK
token**, saved with ``save_pretrained`` as transformers writes any checkpoint.

The weights are random (seeded), the vocabulary is trained on a few standard-library modules'
source, so text prompts tokenize into real merges and multi-byte characters. Tests that need a
MASK id on it pass ``--mask-token-id`` (or let a command add a row): that is the door this
module exists for.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "SPECIALS", "llama_without_mask"]

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _texts() -> list[str]:
    import json as json_module
    import textwrap

    return [inspect.getsource(m) for m in (json_module, textwrap)] + [
        "température °C → K, «exact» 😀 数字 日本語\n\t  tabs and  spaces\n"
    ]


def llama_without_mask(
    directory: Path,
    *,
    seed: int = 0,
    vocab_size: int = 384,
    hidden_size: int = 64,
    layers: int = 4,
    max_positions: int = 512,
    norm_gain: float = 16.0,
) -> Path:
    """Write the micro Llama and its tokenizer to ``directory`` (created) and return it.

    ``vocab_size`` is both the tokenizer's size and the embedding rows (no unused row, as in
    SmolLM2), so a MASK id must come from a flag or an added row."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_texts(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    assert len(tokenizer) == vocab_size, len(tokenizer)
    assert tokenizer.mask_token_id is None

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # Layers ten times the usual scale outweigh the residual stream, so with tied embeddings
        # the next token is not the input token again; the final norm's gain peaks the law, so
        # greedy decoding is not a coin toss between near ties that float rounding could flip.
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.mul_(norm_gain)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    config_file = directory / "config.json"
    assert "mask_token_id" not in json.loads(config_file.read_text())
    return directory
