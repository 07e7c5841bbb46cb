"""Which checkpoints brisk loads, and how.

brisk's decoder and trainers need a causal LM whose forward takes an explicit attention mask and
position ids (they build the ISD and block-diffusion masks themselves), and a MASK token:

- any transformers causal LM class (``AutoModelForCausalLM``), e.g. Qwen3, Llama, Mistral:
  loaded as it is; ``trust_remote_code`` runs a checkpoint's own model code;
- I-DLM's ``SDARForCausalLM`` (architecture ``SDARForCausalLM``, ``model_type`` ``"sdar"``), whose
  model code ships only with the checkpoint: its weights are Qwen3's, parameter for parameter
  (the SDAR model is Qwen3's with block-diffusion attention, which brisk supplies through its own
  masks), so it loads as a ``Qwen3ForCausalLM`` without remote code, keeping ``mask_token_id`` and
  ``block_size`` in the config.

Another architecture whose weights match a transformers class is added to :data:`AS_TRANSFORMERS`
(its config's architecture name → the transformers config class to read it with) and its
``model_type`` to :data:`CONFIG_TWINS`. A model without a MASK token gets one with
:func:`add_mask_token`.

``brisk serve`` runs a checkpoint through SGLang as the same causal LM (:func:`served_as`): SGLang's
own class for ``SDARForCausalLM`` attends bidirectionally (I-DLM's block diffusion), ISD needs the
causal twin, so the server is told to build the twin; an architecture that is neither a
transformers causal LM nor one of :data:`AS_TRANSFORMERS` is refused. :func:`register_config_twins`
lets a process without remote code read such a config (SGLang's, through brisk's plugin).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3Config,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

__all__ = [
    "AS_TRANSFORMERS",
    "CONFIG_TWINS",
    "SDARAsQwen3Config",
    "ServedAs",
    "add_mask_token",
    "load_causal_lm",
    "model_config",
    "register_config_twins",
    "served_as",
]

AS_TRANSFORMERS: dict[str, str] = {"SDARForCausalLM": "qwen3"}


class SDARAsQwen3Config(Qwen3Config):
    """An I-DLM ``sdar`` config read as the Qwen3 config it is (the fields of I-DLM's own
    ``SDARConfig``; ``mask_token_id`` and ``block_size`` kept as extra fields)."""

    model_type = "sdar"


CONFIG_TWINS: dict[str, type[PretrainedConfig]] = {"sdar": SDARAsQwen3Config}
"""The ``model_type`` of each :data:`AS_TRANSFORMERS` checkpoint → the config class that reads it
without its remote code."""


def _raw_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"path: {path} has no config.json (not a transformers checkpoint)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"path: {file} is not readable JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"path: {file} holds no JSON object")
    return raw


@dataclass(frozen=True)
class ServedAs:
    """How a server runs a checkpoint: the causal LM class it builds and, for a checkpoint of
    :data:`AS_TRANSFORMERS`, the twin's ``model_type`` (None: the checkpoint as it is)."""

    architecture: str
    model_type: str | None = None

    def overrides(self) -> dict[str, Any]:
        """SGLang's ``--json-model-override-args`` that build the twin (empty when none): its
        config keeps every other field, ``mask_token_id`` among them.

        >>> ServedAs("Qwen3ForCausalLM", "qwen3").overrides()
        {'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3'}
        """
        if self.model_type is None:
            return {}
        return {"architectures": [self.architecture], "model_type": self.model_type}


def served_as(path: str | Path) -> ServedAs:
    """The causal LM a server runs the checkpoint at ``path`` as (module docstring), from its
    config.json; a ``ValueError`` (``path: ...``) for one brisk cannot serve causally.

    The first architecture the config lists decides, as in SGLang's model registry."""
    raw = _raw_config(Path(path))
    names = raw.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise ValueError(f"path: {path}/config.json names no architectures")
    name = names[0]
    if name in AS_TRANSFORMERS:
        twin = AS_TRANSFORMERS[name]
        return ServedAs(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[twin], twin)
    if name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return ServedAs(name)
    twins = ", ".join(AS_TRANSFORMERS)
    raise ValueError(
        f"path: {path} is a {name}, which brisk cannot serve as a causal LM (not a transformers "
        f"causal LM class, and not one brisk runs as its causal twin: {twins})"
    )


def register_config_twins() -> None:
    """Let transformers read the configs of :data:`CONFIG_TWINS` without remote code, in this
    process. transformers prefers a registered class to a checkpoint's ``auto_map``, so the
    checkpoint's configuration code does not run here even with ``trust_remote_code``."""
    for model_type, config_class in CONFIG_TWINS.items():
        if model_type not in CONFIG_MAPPING:
            AutoConfig.register(model_type, config_class)


def model_config(path: str | Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The checkpoint's config as the transformers class brisk loads it with (module docstring).
    Remote code runs only with ``trust_remote_code``; without it an architecture of
    :data:`AS_TRANSFORMERS` reads as its transformers twin."""
    directory = Path(path)
    raw = _raw_config(directory)
    twin = next(
        (AS_TRANSFORMERS[a] for a in raw.get("architectures") or [] if a in AS_TRANSFORMERS), None
    )
    if twin is None or trust_remote_code:
        return AutoConfig.from_pretrained(
            directory, trust_remote_code=trust_remote_code, local_files_only=True
        )
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    config = AutoConfig.for_model(twin, **fields)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[twin]]
    return config


def load_causal_lm(
    path: str | Path,
    trust_remote_code: bool = False,
    dtype: torch.dtype = torch.float32,
    attention: str | None = None,
) -> PreTrainedModel:
    """The checkpoint's causal LM (module docstring), weights loaded in ``dtype``, on the CPU,
    with the attention implementation ``attention`` (None: transformers' choice). Its weights
    files are checked first (:func:`brisk.runtime.checkpoint.check_model_weights`): a damaged
    one is a ``ValueError`` naming it."""
    from brisk.runtime.checkpoint import check_model_weights

    config = model_config(path, trust_remote_code)
    check_model_weights(path, config, trust_remote_code)
    extra = {"attn_implementation": attention} if attention is not None else {}
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        path,
        config=config,
        trust_remote_code=trust_remote_code,
        dtype=dtype,
        local_files_only=True,
        **extra,
    )
    return model


def add_mask_token(model: PreTrainedModel, tokenizer: Any, token: str = "<|MASK|>") -> int:
    """Give a causal LM without a MASK token one: add ``token`` to the tokenizer (a special
    token), grow the input and output embeddings by the rows the tokenizer now needs (new rows
    at the mean of the old ones, so the new logit starts where an average token's would) and
    record ``mask_token_id`` in the config. Returns the id; a tokenizer that already has the
    token keeps it (and the model is resized only if it is short of rows). The token becomes
    the tokenizer's ``mask_token``, saved with it."""
    existing = tokenizer.convert_tokens_to_ids(token)
    if isinstance(existing, int) and existing != tokenizer.unk_token_id:
        mask_id = existing
        tokenizer.mask_token = token
    else:
        tokenizer.add_special_tokens({"mask_token": token})
        mask_id = int(tokenizer.convert_tokens_to_ids(token))
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.config.mask_token_id = mask_id
    return int(mask_id)
