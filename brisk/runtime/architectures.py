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
(its config's architecture name → the transformers config class to read it with). A model
without a MASK token gets one with :func:`add_mask_token`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

__all__ = [
    "AS_TRANSFORMERS",
    "add_mask_token",
    "load_causal_lm",
    "model_config",
    "training_token_ids",
]

AS_TRANSFORMERS: dict[str, str] = {"SDARForCausalLM": "qwen3"}


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


def model_config(path: str | Path, trust_remote_code: bool = False) -> PretrainedConfig:
    """The checkpoint's config as the transformers class brisk loads it with (module docstring).
    Remote code runs only with ``trust_remote_code``; without it an architecture of
    :data:`AS_TRANSFORMERS` reads as its transformers twin."""
    directory = Path(path)
    raw = _raw_config(directory)
    twin = next((AS_TRANSFORMERS[a] for a in raw.get("architectures") or []
                 if a in AS_TRANSFORMERS), None)  # fmt: skip
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
        path, config=config, trust_remote_code=trust_remote_code, dtype=dtype,
        local_files_only=True, **extra,
    )  # fmt: skip
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


def training_token_ids(tokenizer: Any, config: Any, where: str) -> tuple[int, int]:
    """The MASK and padding ids training lays batches out with: the config's ``mask_token_id``
    (I-DLM checkpoints) or the tokenizer's mask token; the tokenizer's pad token, else its EOS
    (padding is never attended or scored). ``where`` names the checkpoint in the error."""
    mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None:
        mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError(
            f"{where}: the model has no MASK token (no config.mask_token_id, no tokenizer mask "
            "token); add one with brisk.runtime.architectures.add_mask_token"
        )
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    if pad_id is None:
        raise ValueError(f"{where}: the tokenizer has neither a pad nor an EOS token")
    return int(mask_id), int(pad_id)
