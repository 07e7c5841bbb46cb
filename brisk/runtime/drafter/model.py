"""A DFlash-shaped block drafter, in the ``DFlashDraftModel`` checkpoint format.

The drafter proposes the M = B − 1 tokens after an anchor in one forward, conditioned on the
target's hidden states (paper, sec:background: the drafter family of verified parallel decoders):

- **context**: the target's hidden states at the layers ``target_layer_ids`` (the *output* of
  decoder layer i, HF ``hidden_states[i + 1]``), concatenated in that order, then ``fc``
  (k·H → H, no bias) and the RMSNorm ``hidden_norm``. Every drafter layer projects this same
  tensor with its own ``k_proj`` / ``v_proj`` (``k_norm`` and rotary at the tokens' absolute
  positions; no ``input_layernorm``) and puts it ahead of the block's keys and values;
- **block**: ``[anchor, MASK × M]`` embedded with the target's ``embed_tokens`` at positions
  s .. s + M, attending to all its context and within itself in both directions;
- **proposals**: the final ``norm``, then the target's ``lm_head`` at block offsets 1..M; offset
  k proposes the token at position s + k.

The drafter owns no embedding and no LM head: the target's are passed in. Weights are stored
under the names DFlash drafters use (``layers.{i}.self_attn.q_proj.weight``, ``fc.weight``,
``hidden_norm.weight``, ``norm.weight``; no ``model.`` prefix) and the config is a Qwen3 config
with ``architectures: ["DFlashDraftModel"]``, top-level ``block_size`` and
``num_target_layers``, and ``dflash_config: {mask_token_id, target_layer_ids}``, so a drafter
brisk trains loads where DFlash drafters load (SGLang's ``DFlashDraftModel``) and a DFlash
checkpoint loads here.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import PretrainedConfig, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from brisk._atomic import building_dir
from brisk.runtime.checkpoint import tensor_shapes

__all__ = [
    "ARCHITECTURE",
    "DFlashDrafter",
    "DrafterSpec",
    "build_target_layer_ids",
    "drafter_config",
    "load_drafter",
    "save_drafter",
]

ARCHITECTURE = "DFlashDraftModel"
WEIGHTS = "model.safetensors"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default choice of target layers, spread evenly over 1..L − 3 (one draft layer:
    the middle one). Python's ``round`` (half to even), as DFlash and SGLang compute it.

    >>> build_target_layer_ids(36, 5), build_target_layer_ids(36, 1), build_target_layer_ids(28, 5)
    ([1, 9, 17, 25, 33], [18], [1, 7, 13, 19, 25])
    """
    if num_draft_layers < 1:
        raise ValueError(f"num_draft_layers: need ≥ 1, got {num_draft_layers}")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(
            f"num_target_layers: {num_target_layers} layers leave no range 1..L−3 to spread "
            f"{num_draft_layers} draft layers' features over; give target_layer_ids"
        )
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DrafterSpec:
    """What a drafter reads from its config beyond the Qwen3 architecture."""

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int

    @property
    def M(self) -> int:
        """Proposal positions per block: the block minus its anchor."""
        return self.block_size - 1

    @classmethod
    def of(cls, config: PretrainedConfig) -> DrafterSpec:
        """Read a DFlash drafter config; one line naming the field that is missing or wrong."""
        dflash = getattr(config, "dflash_config", None)
        if not isinstance(dflash, dict):
            raise ValueError("config: a DFlash drafter needs a dflash_config mapping")
        block = getattr(config, "block_size", None)
        mask = dflash.get("mask_token_id")
        ids = dflash.get("target_layer_ids")
        layers = getattr(config, "num_target_layers", None)
        for name, value in (
            ("block_size", block),
            ("dflash_config.mask_token_id", mask),
            ("num_target_layers", layers),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"config: {name} must be an integer, got {value!r}")
        block, mask, layers = int(block), int(mask), int(layers)  # type: ignore[arg-type]
        if block < 2:
            raise ValueError(f"config: block_size must be ≥ 2 (an anchor, a proposal), got {block}")
        if ids is None:
            ids = build_target_layer_ids(layers, config.num_hidden_layers)
        if not ids or not all(isinstance(i, int) and 0 <= i < layers for i in ids):
            raise ValueError(
                f"config: dflash_config.target_layer_ids must be layer ids in 0..{layers - 1}, "
                f"got {ids!r}"
            )
        if any(b <= a for a, b in itertools.pairwise(ids)):
            raise ValueError(
                "config: dflash_config.target_layer_ids must increase (a server captures the "
                f"target's features in layer order, each once), got {ids!r}"
            )
        vocab = getattr(config, "vocab_size", None)
        if isinstance(vocab, int) and not 0 <= mask < vocab:
            raise ValueError(
                f"config: dflash_config.mask_token_id {mask} is outside the vocabulary "
                f"0..{vocab - 1}"
            )
        return cls(block, mask, tuple(ids), layers)


def drafter_config(
    target: PretrainedConfig,
    *,
    num_layers: int = 1,
    block_size: int = 16,
    mask_token_id: int,
    target_layer_ids: list[int] | None = None,
    intermediate_size: int | None = None,
) -> Qwen3Config:
    """The config of a new drafter for ``target`` (a Qwen3- or Llama-shaped causal LM config):
    the target's width, heads, rotary and vocabulary, ``num_layers`` decoder layers, and the
    DFlash fields (default target layers: :func:`build_target_layer_ids`)."""
    L = target.num_hidden_layers
    if target_layer_ids is not None and not target_layer_ids:
        raise ValueError("target_layer_ids: give at least one layer (None: DFlash's default)")
    ids = target_layer_ids or build_target_layer_ids(L, num_layers)
    if max(ids) > L - 2:
        raise ValueError(
            f"target_layer_ids: {ids} for a target of {L} layers; each must be at most L − 2 "
            f"= {L - 2} (the last layer's output is not captured by a server)"
        )
    heads = target.num_attention_heads
    config = Qwen3Config(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=intermediate_size or target.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target, "num_key_value_heads", None) or heads,
        head_dim=getattr(target, "head_dim", None) or target.hidden_size // heads,
        hidden_act=getattr(target, "hidden_act", "silu"),
        max_position_embeddings=target.max_position_embeddings,
        rms_norm_eps=getattr(target, "rms_norm_eps", 1e-6),
        rope_parameters=getattr(target, "rope_parameters", None),
        attention_bias=getattr(target, "attention_bias", False),
        tie_word_embeddings=False,
        bos_token_id=target.bos_token_id,
        eos_token_id=target.eos_token_id,
        pad_token_id=getattr(target, "pad_token_id", None),
        layer_types=["full_attention"] * num_layers,
    )
    config.architectures = [ARCHITECTURE]
    config.block_size = block_size
    config.num_target_layers = L
    config.dflash_config = {"mask_token_id": mask_token_id, "target_layer_ids": list(ids)}
    DrafterSpec.of(config)  # the same checks a loaded checkpoint gets
    return config


class _Attention(nn.Module):
    """Qwen3 attention whose keys and values are the context's, then the block's own."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        bias = config.attention_bias
        H = config.hidden_size
        self.q_proj = nn.Linear(H, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(H, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        B, S, _ = x.shape
        return x.view(B, S, heads, self.head_dim).transpose(1, 2)  # [B, heads, S, d]

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (normed, rotated) and values ``[B, kv_heads, S, d]`` of ``x [B, S, H]``."""
        k = self.k_norm(self._split(self.k_proj(x), self.kv_heads))
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        return k, self._split(self.v_proj(x), self.kv_heads)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        context: tuple[Tensor, Tensor],
        mask: Tensor | None,
    ) -> Tensor:
        q = self.q_norm(self._split(self.q_proj(x), self.heads))
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = torch.cat([context[0], k], dim=2)
        v = torch.cat([context[1], v], dim=2)
        groups = self.heads // self.kv_heads
        out = nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, groups), repeat_kv(v, groups), attn_mask=mask
        )
        B, _, S, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class _Layer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        h: Tensor,
        cos: Tensor,
        sin: Tensor,
        context: tuple[Tensor, Tensor],
        mask: Tensor | None,
    ) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, context, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


ContextKV = list[tuple[Tensor, Tensor]]  # per layer: keys, values [B, kv_heads, C, d]


class DFlashDrafter(nn.Module):
    """The drafter (module docstring). :meth:`project` turns target features into context
    states, :meth:`context_kv` those into every layer's keys and values, :meth:`forward` runs a
    block against them and returns the normed hidden states (the target's ``lm_head`` makes
    them proposals)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        self.spec = DrafterSpec.of(config)
        H = config.hidden_size
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(self.spec.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def features(self, hidden_states: tuple[Tensor, ...] | list[Tensor]) -> Tensor:
        """The target features ``[B, S, k·H]`` from a target forward's ``hidden_states``
        (embeddings first, then each decoder layer's output)."""
        return torch.cat([hidden_states[i + 1] for i in self.spec.target_layer_ids], dim=-1)

    def project(self, features: Tensor) -> Tensor:
        """Context states ``[B, C, H]``: ``hidden_norm(fc(features))``."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, context: Tensor, positions: Tensor) -> ContextKV:
        """Every layer's keys and values of context states ``[B, C, H]`` at ``positions [B, C]``."""
        cos, sin = self.rotary_emb(context, positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def forward(
        self, embeds: Tensor, positions: Tensor, context: ContextKV, mask: Tensor | None = None
    ) -> Tensor:
        """Normed hidden states ``[B, S, H]`` of block embeddings ``[B, S, H]`` at
        ``positions [B, S]`` against ``context`` (:meth:`context_kv`). ``mask``: a boolean
        ``[B, 1, S, C + S]`` of which keys each query sees (None: all of them)."""
        cos, sin = self.rotary_emb(embeds, positions)
        h = embeds
        for layer, kv in zip(self.layers, context, strict=True):
            h = layer(h, cos, sin, kv, mask)
        return self.norm(h)


def save_drafter(
    drafter: DFlashDrafter, path: str | Path, extra: Callable[[Path], object] | None = None
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the DFlash format, atomically (a
    reader sees the old checkpoint or the new one); ``extra(directory)`` writes what else the
    checkpoint holds (a trainer's config and state) before it is moved into place."""
    path = Path(path)
    with building_dir(path) as tmp:
        write_drafter(drafter, tmp)
        if extra is not None:
            extra(tmp)
    return path


def write_drafter(drafter: DFlashDrafter, directory: Path) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the DFlash format into ``directory``
    (:func:`save_drafter` writes them atomically)."""
    drafter.config.dtype = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    drafter.config.save_pretrained(directory)
    state = {k: v.detach().contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(directory / WEIGHTS), metadata={"format": "pt"})


# What a drafter's config.json must give: the sizes its weights take (Qwen3Config's defaults
# are a 4,096-wide model's, and would be built before the weights could disagree) and the
# DFlash fields.
REQUIRED_SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "block_size",
    "num_target_layers",
)


def _read_config(config_file: Path) -> dict[str, Any]:
    """The drafter's config.json as a mapping, with the fields :data:`REQUIRED_SIZES` and
    ``dflash_config`` present and well typed; one line naming the file otherwise."""
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"drafter: {config_file}: invalid JSON at line {err.lineno}, column {err.colno} "
            f"({err.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"drafter: {config_file}: unreadable ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"drafter: {config_file}: holds no JSON object")
    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise ValueError(
            f"drafter: {config_file} is not a DFlash drafter (architectures "
            f"{raw.get('architectures')!r}, need {ARCHITECTURE!r})"
        )
    where = f"drafter: {config_file}"
    for name in (*REQUIRED_SIZES, "dflash_config"):
        if name not in raw:
            raise ValueError(f'{where}: no "{name}" field (a DFlash drafter needs it)')
    for name in REQUIRED_SIZES:
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f'{where}: "{name}" must be an integer ≥ 1, got {value!r}')
    return raw


def load_drafter(path: str | Path, *, device: torch.device | str = "cpu") -> DFlashDrafter:
    """A DFlash drafter checkpoint (brisk's or DFlash's): a config.json naming the sizes and
    the DFlash fields, and every weight the format names there with its shape, and no other (a
    ``model.`` prefix is accepted). Anything else (invalid JSON, a missing or mistyped field, a
    truncated or foreign weights file, a missing, extra or misshapen tensor) is one
    ``ValueError`` line naming the file and the line and column, field or key; the weights'
    names and shapes are checked from the safetensors header before any tensor is read."""
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"drafter: {path} has no config.json")
    raw = _read_config(config_file)
    raw.pop("auto_map", None)
    try:
        config = Qwen3Config(**{k: v for k, v in raw.items() if k != "model_type"})
        drafter = DFlashDrafter(config)
    except (TypeError, ValueError) as err:  # transformers' field checks raise TypeError
        detail = " ".join(str(err).split()).removeprefix("config: ")
        raise ValueError(f"drafter: {config_file}: {detail}") from None
    weights = path / WEIGHTS
    if not weights.is_file():
        raise ValueError(f"drafter: {path} has no {WEIGHTS}")
    try:
        found = {k.removeprefix("model."): v for k, v in tensor_shapes(weights).items()}
    except ValueError as err:
        raise ValueError(f"drafter: {err}") from None
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    for key in sorted(set(expected) | set(found)):
        if key not in found:
            raise ValueError(f"drafter: {weights} lacks {key}")
        if key not in expected:
            raise ValueError(f"drafter: {weights} has {key}, which a DFlash drafter has not")
        if found[key] != expected[key]:
            raise ValueError(
                f"drafter: {weights}: {key} has shape {found[key]}, the config gives "
                f"{expected[key]}"
            )
    state = {k.removeprefix("model."): v for k, v in load_file(str(weights)).items()}
    drafter.load_state_dict(state)
    return drafter.to(device)
