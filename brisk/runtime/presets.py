"""Named model presets: a model built from scratch with its tokenizer (``brisk train base``
without ``init``), by name (:class:`NamedModel`, a training config's ``[model]`` table).

A preset registers a build function of its settings returning ``(model, tokenizer)``, a
tokenizer function of its settings, its settings class (a :class:`~brisk.runtime.configs.Config`
with a ``max_positions`` field: the longest sequence the model takes) and named settings. Worlds
register their presets (:mod:`brisk.runtime.registry`): the arithmetic world's tiny Qwen3 is
``tiny``, the code world's ``code``.

The worlds' models share one shape, :class:`Qwen3Shape` (the architecture of the I-DLM
checkpoints, untied embeddings), built fresh by :func:`build_model` around a world's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from brisk.runtime.configs import Config, Registered
from brisk.runtime.registry import Registry

if TYPE_CHECKING:  # transformers loads when a model is built, not when a config is read
    from tokenizers import Tokenizer
    from transformers import (
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

__all__ = [
    "NamedModel",
    "Preset",
    "Qwen3Shape",
    "build_model",
    "build_preset",
    "dlm_tokenizer",
    "preset_names",
    "preset_tokenizer",
    "qwen3_config",
    "register_preset",
]


@dataclass(frozen=True)
class Preset:
    """A registered model preset."""

    build: Callable[[Any], tuple[Any, Any]]  # settings -> (model, tokenizer)
    tokenizer: Callable[[Any], Any]  # settings -> tokenizer
    settings: type[Config]
    presets: Mapping[str, Callable[[], Config]] = field(default_factory=dict)


PRESETS: Registry[Preset] = Registry("model")


def register_preset(
    name: str,
    build: Callable[[Any], tuple[Any, Any]],
    tokenizer: Callable[[Any], Any],
    settings: type[Config],
    presets: Mapping[str, Callable[[], Config]] | None = None,
) -> None:
    """Make ``build(settings) -> (model, tokenizer)`` available as the preset ``name``,
    ``tokenizer(settings)`` its tokenizer alone, ``settings`` the class of its settings and
    ``presets`` named settings (e.g. ``micro`` for tests)."""
    PRESETS.register(name, Preset(build, tokenizer, settings, dict(presets or {})))


def preset_names() -> list[str]:
    return PRESETS.names()


def build_preset(name: str, settings: Config | None = None) -> tuple[Any, Any]:
    """A fresh model of preset ``name`` (seed torch first for reproducibility) and its
    tokenizer; ``settings`` None: the preset's defaults."""
    preset = PRESETS.get(name)
    return preset.build(settings if settings is not None else preset.settings())


def preset_tokenizer(name: str, settings: Config | None = None) -> Any:
    """The tokenizer of preset ``name`` with ``settings`` (None: the preset's defaults)."""
    preset = PRESETS.get(name)
    return preset.tokenizer(settings if settings is not None else preset.settings())


@dataclass(frozen=True)
class NamedModel(Registered):
    """A model preset by name with its settings (``[model]``: ``name = "tiny"`` beside the
    settings' keys, e.g. ``hidden_size``)."""

    kind: ClassVar[str] = "model"

    @classmethod
    def entry(cls, name: str) -> tuple[type[Config], dict[str, Any]]:
        preset = PRESETS.get(name)
        return preset.settings, dict(preset.presets)

    def build(self) -> tuple[Any, Any]:
        """A fresh model of these settings and its tokenizer."""
        return build_preset(self.name, self.settings)

    def tokenizer(self) -> Any:
        """The tokenizer these settings build the model around."""
        return preset_tokenizer(self.name, self.settings)

    @property
    def max_positions(self) -> int:
        return int(self.settings.max_positions)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Qwen3Shape(Config):
    """Shape of a randomly initialized Qwen3 (untied embeddings, like I-DLM's checkpoints); the
    vocabulary is the tokenizer's."""

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


def dlm_tokenizer(
    backend: Tokenizer, *, pad: str, bos: str, eos: str, mask: str, **extra: Any
) -> PreTrainedTokenizerFast:
    """``backend`` as the transformers tokenizer of a preset: ``bos`` before every text and
    ``mask`` its MASK token (``extra``: further ``PreTrainedTokenizerFast`` arguments).

    Models are trained on ``[bos, prompt, response, eos]``, so encoding with special tokens puts
    BOS first, as Llama's tokenizers do: a post-processor saved in ``tokenizer.json``, so loaders
    that never read ``add_bos_token`` (older transformers, SGLang's tokenizer manager,
    ``tokenizers`` alone) add it too, and the flags transformers rebuilds it from. The
    post-processor is set on ``backend`` itself.
    """
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0",
        pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, backend.token_to_id(bos))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        mask_token=mask,
        add_bos_token=True,
        add_eos_token=False,
        **extra,
    )


def qwen3_config(shape: Qwen3Shape, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """A ``Qwen3Config`` of ``shape`` carrying ``tokenizer``'s special ids, including I-DLM's
    ``mask_token_id``."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden_size // shape.heads,
        max_position_embeddings=shape.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    config.mask_token_id = tokenizer.mask_token_id
    # sdpa takes the block-diffusion mask as an additive float mask, like eager, but faster.
    config._attn_implementation = "sdpa"
    return config


def build_model(shape: Qwen3Shape, tokenizer: PreTrainedTokenizerBase) -> Qwen3ForCausalLM:
    """A freshly initialized Qwen3 of ``shape`` around ``tokenizer`` (seed torch first for
    reproducibility); nothing downloaded."""
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM(qwen3_config(shape, tokenizer))
