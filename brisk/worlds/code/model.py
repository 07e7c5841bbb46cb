"""The model preset ``code``: a Qwen3 shape (:class:`~brisk.runtime.presets.Qwen3Shape`, I-DLM's
architecture) with the code world's byte-level BPE tokenizer.

Settings presets: ``micro`` (tests: 2 layers, hidden 64, a 512-token vocabulary trained on the
micro corpus) and ``small`` (the default: ≈ 5 M parameters, 4 layers, hidden 256, 4096 tokens
trained on the whole stdlib, 512 positions; sized for an hour of CPU pre-training).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brisk.runtime.presets import Qwen3Shape, build_model
from brisk.worlds.code.corpus import CorpusConfig

if TYPE_CHECKING:  # transformers loads when a model is built, not when a config is read
    from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

__all__ = ["CodeModelConfig", "code_preset", "preset_tokenizer"]


@dataclass(frozen=True)
class CodeModelConfig(Qwen3Shape):
    """A :class:`~brisk.runtime.presets.Qwen3Shape` with the tokenizer it is built for."""

    hidden_size: int = 256  # layers, heads and kv_heads: Qwen3Shape's
    intermediate_size: int = 768
    max_positions: int = 512
    vocab_size: int = 4096  # of the byte-level BPE tokenizer (specials and 256 bytes included)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)  # what the tokenizer learns on

    @classmethod
    def small(cls) -> CodeModelConfig:
        """The default: ≈ 5.3 M parameters, 4096 tokens, 512 positions."""
        return cls()

    @classmethod
    def micro(cls) -> CodeModelConfig:
        """For unit tests: 2 layers, hidden 64, 512 tokens learnt on the micro corpus."""
        return cls(
            hidden_size=64,
            layers=2,
            intermediate_size=128,
            max_positions=256,
            vocab_size=512,
            corpus=CorpusConfig.micro(),
        )

    def tokenizer(self) -> PreTrainedTokenizerFast:
        """The BPE tokenizer of these settings (trained once, then cached)."""
        from brisk.worlds.code.tokenizer import code_tokenizer

        return code_tokenizer(self.vocab_size, self.corpus)


def code_preset(cfg: CodeModelConfig) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerFast]:
    """The preset's build: a fresh model of ``cfg`` and its tokenizer."""
    tokenizer = cfg.tokenizer()
    return build_model(cfg, tokenizer), tokenizer


def preset_tokenizer(cfg: CodeModelConfig) -> PreTrainedTokenizerFast:
    """The preset's tokenizer alone: the one ``cfg`` builds its model around."""
    return cfg.tokenizer()
