"""The model preset ``tiny``: Qwen3, the same architecture as the I-DLM checkpoints, small enough
for a CPU, with the character tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from brisk.runtime.presets import Qwen3Shape, build_model, qwen3_config

if TYPE_CHECKING:  # transformers loads when a model is built, not when a config is read
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

__all__ = ["TinyModelConfig", "build_model", "qwen3_config", "tiny_preset", "tiny_tokenizer"]


@dataclass(frozen=True)
class TinyModelConfig(Qwen3Shape):
    """The tiny preset's settings: a :class:`~brisk.runtime.presets.Qwen3Shape` with named
    sizes (the model is built by :func:`~brisk.runtime.presets.build_model`)."""

    @classmethod
    def tiny(cls) -> TinyModelConfig:
        """The tiny base model (≈0.8 M parameters): 4 layers, hidden 128."""
        return cls()

    @classmethod
    def micro(cls) -> TinyModelConfig:
        """For unit tests: 2 layers, hidden 64; trains in seconds."""
        return cls(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128)


# The tokenizer module imports transformers: loaded when a model or tokenizer is built, so that
# registering the world (any registry lookup, the command line's among them) stays cheap.


def tiny_preset(cfg: TinyModelConfig) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """The preset's build: a fresh model of ``cfg`` and the character tokenizer."""
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    return build_model(cfg, tokenizer), tokenizer


def tiny_tokenizer(cfg: TinyModelConfig | None = None) -> PreTrainedTokenizerFast:
    """The preset's tokenizer: the character tokenizer, whatever the settings."""
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    return char_tokenizer()
