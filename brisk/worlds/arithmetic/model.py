"""The model preset ``tiny``: Qwen3, the same architecture as the I-DLM checkpoints, small enough
for a CPU, with the character tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from brisk.runtime.configs import Config

if TYPE_CHECKING:  # transformers loads when a model is built, not when a config is read
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

__all__ = ["TinyModelConfig", "build_model", "qwen3_config", "tiny_preset", "tiny_tokenizer"]


@dataclass(frozen=True)
class TinyModelConfig(Config):
    """Shape of a randomly initialized Qwen3 (untied embeddings, like I-DLM's checkpoints)."""

    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 128
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError("heads: hidden_size must divide by heads, heads by kv_heads")
        super().__post_init__()

    @classmethod
    def tiny(cls) -> TinyModelConfig:
        """The tiny base model (≈0.8 M parameters): 4 layers, hidden 128."""
        return cls()

    @classmethod
    def micro(cls) -> TinyModelConfig:
        """For unit tests: 2 layers, hidden 64; trains in seconds."""
        return cls(hidden_size=64, layers=2, heads=4, kv_heads=2, intermediate_size=128)


def qwen3_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3Config:
    """A ``Qwen3Config`` carrying the special ids, including I-DLM's ``mask_token_id``."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden_size // cfg.heads,
        max_position_embeddings=cfg.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.mask_token_id = tokenizer.mask_token_id
    # sdpa takes the block-diffusion mask as an additive float mask, like eager, but faster.
    config._attn_implementation = "sdpa"
    return config


def build_model(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A freshly initialized model (seed torch first for reproducibility); nothing downloaded."""
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM(qwen3_config(cfg, tokenizer))


# The tokenizer module imports transformers: loaded when a model or tokenizer is built, so that
# registering the world (any registry lookup, the command line's among them) stays cheap.


def tiny_preset(cfg: TinyModelConfig) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """The preset's build: a fresh model of ``cfg`` and the character tokenizer."""
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    tokenizer = char_tokenizer()
    return build_model(cfg, tokenizer), tokenizer


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from brisk.worlds.arithmetic.tokenizer import char_tokenizer

    return char_tokenizer()
