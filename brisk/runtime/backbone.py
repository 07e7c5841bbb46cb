"""What decoding needs from a model, and the adapter that gets it from any transformers causal LM.

ISD and the corrector touch the model only through :class:`Backbone`: a forward that returns the
logits and the last hidden state of a block of new tokens on top of a KV cache, KV operations kept
apart from it (trim the tail, gather rows and slots), input-embedding and LM-head rows, and the
MASK id. Keeping the KV operations separate is what lets a paged cache (SGLang's) implement the
same contract. The forward has no side effects beyond appending to the cache: train/eval mode and
gradient recording are the caller's (``decode`` runs under ``torch.inference_mode``; a trainer
calls the same forward with gradients on). :class:`HFBackbone` provides this for any
``AutoModelForCausalLM`` (our tiny Qwen3, a user's Qwen3 or Llama) and for an I-DLM
``SDARForCausalLM`` checkpoint, which loads as Qwen3 without remote code
(:mod:`brisk.runtime.architectures`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from transformers import AutoTokenizer, DynamicCache, PreTrainedModel

__all__ = [
    "MASK_TOKEN",
    "Backbone",
    "BlockOutput",
    "HFBackbone",
    "ModelHeads",
    "cache_keyword",
    "resolve_mask_id",
]

MASK_TOKEN = "<|MASK|>"


@dataclass(frozen=True)
class BlockOutput:
    logits: Tensor  # [B, T, V]  logits[:, t] predicts the token after new token t ([B, T', V]
    # when the forward was asked for the slots ``logits_at`` only)
    hidden: Tensor  # [B, T, H]  last-layer hidden states (after the final norm)


@runtime_checkable
class Backbone(Protocol):
    """The model as decoding sees it. A cache holds the KV of ``cache_length`` physical slots per
    row; ``forward`` appends ``T`` new slots, attending causally to the cache and to each other
    unless an explicit mask says otherwise."""

    @property
    def mask_token_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def max_positions(self) -> int | None:
        """Largest position id the model supports plus one (``None``: unbounded / unknown)."""
        ...

    @property
    def device(self) -> torch.device: ...

    def new_cache(self) -> Any: ...

    def cache_length(self, cache: Any) -> int: ...

    def forward(
        self,
        input_ids: Tensor,
        cache: Any,
        *,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        logits_at: Tensor | None = None,
    ) -> BlockOutput:
        """``input_ids [B, T]`` → logits ``[B, T, V]`` and hidden ``[B, T, H]``; appends T slots.

        By default the new tokens sit at the next positions and attend causally to the whole
        cache. Batched decoding whose rows own different cache slots passes ``position_ids
        [B, T]`` and a boolean ``attention_mask [B, 1, T, cache + T]`` (True = may attend).
        ``logits_at [B, T']`` (indices into the T new slots) asks for the logits of those slots
        only, ``[B, T', V]``: a prefill reads one row of logits per request, and at V = 151,936
        the whole ``[B, T, V]`` would dwarf the model.
        """
        ...

    def trim(self, cache: Any, keep: int) -> None:
        """Drop every physical slot from ``keep`` on (rejected speculative slots at the tail)."""
        ...

    def gather(self, cache: Any, rows: Tensor, slots: Tensor) -> None:
        """Keep rows ``rows [B']`` and, for new row r, old row ``rows[r]``'s physical slots
        ``slots[r] [T']`` in that order (compaction after rejections, retiring finished rows)."""
        ...

    def embed(self, ids: Tensor) -> Tensor:
        """Input embeddings ``[..., H]`` of token ids ``[...]``."""
        ...

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        """Output-embedding rows ``E_out(v)`` ``[..., H]``: ``logit_v = ⟨hidden, E_out(v)⟩``."""
        ...


def cache_keyword(model: torch.nn.Module) -> str:
    """The name ``model.forward`` takes its KV cache by: ``cache`` from transformers 5.24 on
    (``past_key_values`` is deprecated there, with a warning per call), ``past_key_values``
    before."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class HFBackbone:
    """:class:`Backbone` over a transformers causal LM with a ``DynamicCache``.

    The forward runs the decoder stack (``model.base_model``) for the last hidden state only and
    applies the LM head to it; models that post-process their logits (soft-capping, scaling)
    need their own adapter.
    """

    def __init__(self, model: PreTrainedModel, mask_token_id: int) -> None:
        vocab = model.get_output_embeddings().weight.shape[0]
        if not 0 <= mask_token_id < vocab:
            raise ValueError(
                f"mask_token_id: {mask_token_id} is outside the vocabulary 0..{vocab - 1}"
            )
        self.model = model
        self._mask_token_id = int(mask_token_id)
        self._cache_keyword = cache_keyword(model.base_model)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        mask_token_id: int | None = None,
        trust_remote_code: bool = False,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        attention: str | None = None,
        need_mask: bool = True,
    ) -> HFBackbone:
        """Load a local checkpoint directory (in eval mode), its weights read in ``dtype`` and
        moved to ``device``, with the attention implementation ``attention`` (None: the one
        transformers picks, sdpa where it has it). Commands load through
        :func:`brisk.runtime.loader.load_model`, which resolves device and dtype. The MASK id is
        :func:`resolve_mask_id`'s (the argument, else the tokenizer's mask token, else the
        config's ``mask_token_id``, else the tokenizer's ``<|MASK|>``). A path that is not a
        directory is an error, never a hub lookup; so is a weights file that is truncated, not
        safetensors or of the wrong shapes, named in one line
        (:func:`brisk.runtime.architectures.load_causal_lm`). ``need_mask=False``: a caller that
        never reads the MASK id (plain decoding) loads a checkpoint that defines none, row 0
        standing in."""
        from safetensors import SafetensorError

        from brisk.runtime.architectures import load_causal_lm

        if not Path(path).is_dir():
            raise ValueError(f"path: {path} is not a checkpoint directory")
        try:
            model = load_causal_lm(path, trust_remote_code, dtype, attention).to(device)
        except (RuntimeError, SafetensorError) as err:  # what the header checks cannot see
            first = next((line for line in str(err).splitlines() if line.strip()), repr(err))
            raise ValueError(f"path: cannot load the model in {path}: {first.strip()}") from None
        model.eval()
        rows = int(model.get_output_embeddings().weight.shape[0])
        tokenizer = _saved_tokenizer(path, trust_remote_code)
        try:
            mask_id = resolve_mask_id(
                tokenizer,
                model.config,
                mask_token_id,
                rows=rows,
                source=str(path),
                flag="mask_token_id",
            )
        except ValueError:
            if need_mask or mask_token_id is not None:
                raise
            mask_id = 0
        return cls(model, mask_id)

    @property
    def mask_token_id(self) -> int:
        return self._mask_token_id

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value is not None else None

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.device)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def cache_length(self, cache: DynamicCache) -> int:
        return int(cache.get_seq_length())

    def forward(
        self,
        input_ids: Tensor,
        cache: DynamicCache,
        *,
        position_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        logits_at: Tensor | None = None,
    ) -> BlockOutput:
        if position_ids is None:
            start = self.cache_length(cache)
            T = input_ids.shape[1]
            position_ids = torch.arange(start, start + T, device=input_ids.device)
            position_ids = position_ids.expand_as(input_ids)
        out = self.model.base_model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=True,
            **{self._cache_keyword: cache},
        )
        hidden = out.last_hidden_state
        read = hidden if logits_at is None else hidden.gather(1, _rows_index(logits_at, hidden))
        return BlockOutput(logits=self.model.get_output_embeddings()(read), hidden=hidden)

    def trim(self, cache: DynamicCache, keep: int) -> None:
        length = self.cache_length(cache)
        if not 0 <= keep <= length:
            raise ValueError(f"keep: must lie in 0..{length} (the cache length), got {keep}")
        # DynamicCache.crop takes a negative count of slots to drop.
        cache.crop(keep - length)

    def gather(self, cache: DynamicCache, rows: Tensor, slots: Tensor) -> None:
        if slots.ndim != 2 or slots.shape[0] != rows.shape[0]:
            raise ValueError(f"slots: expected [{rows.shape[0]}, T'], got {tuple(slots.shape)}")
        for layer in cache.layers:
            if not layer.is_initialized or layer.keys.numel() == 0:
                continue
            for name in ("keys", "values"):
                kv = getattr(layer, name)[rows]  # [B', heads, T, D]
                index = slots[:, None, :, None].expand(-1, kv.shape[1], -1, kv.shape[3])
                setattr(layer, name, kv.gather(2, index))

    def embed(self, ids: Tensor) -> Tensor:
        out: Tensor = self.model.get_input_embeddings()(ids)
        return out

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        rows: Tensor = self.model.get_output_embeddings().weight[ids]
        return rows


def _rows_index(at: Tensor, hidden: Tensor) -> Tensor:
    """``at [B, T']`` as a gather index over ``hidden [B, T, H]``'s slots."""
    return at.to(hidden.device, torch.long)[..., None].expand(-1, -1, hidden.shape[-1])


def _saved_tokenizer(path: str | Path, trust_remote_code: bool) -> Any:
    """The tokenizer saved beside the weights, or None where there is none."""
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def resolve_mask_id(
    tokenizer: Any,
    config: Any,
    given: int | None = None,
    *,
    rows: int | None = None,
    fallback: int | None = None,
    source: str = "the checkpoint",
    flag: str = "--mask-token-id",
) -> int:
    """The MASK id a model decodes and trains with, by one order for every command:

    1. ``given``: the ``--mask-token-id`` flag, or a training config's ``mask_token_id``;
    2. the tokenizer's mask token (a checkpoint trained with one, ``--add-mask-token``'s);
    3. the checkpoint config's ``mask_token_id`` (I-DLM checkpoints: 151669);
    4. the tokenizer's ``<|MASK|>`` token, where it is not declared the mask token;
    5. ``fallback`` (the drafter's: the first embedding row no token uses, DFlash's choice).

    The id is checked: it lies inside the ``rows`` embedding rows (default: the config's
    ``vocab_size``), and it is none of the special tokens the model uses (the tokenizer's and
    the config's bos, eos and pad, and the special tokens its chat template writes), which a
    MASK would be confused with. ``tokenizer`` may be None (none saved). Every error is one
    ``ValueError`` naming ``flag``.

    >>> from types import SimpleNamespace as C
    >>> resolve_mask_id(None, C(vocab_size=8, mask_token_id=7))
    7
    >>> resolve_mask_id(None, C(vocab_size=8, eos_token_id=2), 2)
    Traceback (most recent call last):
    ValueError: --mask-token-id: 2 is the model's eos token (config eos_token_id), not a free id
    """
    rows = int(rows if rows is not None else config.vocab_size)
    chosen = given
    if chosen is None and tokenizer is not None:
        chosen = tokenizer.mask_token_id
    if chosen is None:
        chosen = getattr(config, "mask_token_id", None)
    if chosen is None and tokenizer is not None:
        named = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if isinstance(named, int) and named != tokenizer.unk_token_id:
            chosen = named
    if chosen is None:
        chosen = fallback
    if chosen is None:
        raise ValueError(
            f"{flag}: {source} defines no MASK token (no mask token in its tokenizer, no "
            "mask_token_id in its config); pass --mask-token-id ID (a token the model never "
            "uses), or give the checkpoint a MASK row when training from it (--add-mask-token)"
        )
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < rows:
        raise ValueError(
            f"{flag}: {chosen!r} is outside the vocabulary 0..{rows - 1} (the model's "
            f"{rows} embedding rows)"
        )
    used = _used_specials(tokenizer, config)
    if chosen in used:
        raise ValueError(f"{flag}: {chosen} is the model's {used[chosen]}, not a free id")
    return int(chosen)


def _used_specials(tokenizer: Any, config: Any) -> dict[int, str]:
    """The special ids a model uses, each with what it is (``eos token <|im_end|>``): the
    tokenizer's and the config's bos, eos and pad, and the special tokens the chat template
    writes."""
    used: dict[int, str] = {}
    for name in ("bos", "eos", "pad"):
        if tokenizer is not None:
            token_id = getattr(tokenizer, f"{name}_token_id", None)
            if isinstance(token_id, int):
                used.setdefault(token_id, f"{name} token {getattr(tokenizer, f'{name}_token')}")
        value = getattr(config, f"{name}_token_id", None)
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int):
                used.setdefault(token_id, f"{name} token (config {name}_token_id)")
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        for token in tokenizer.all_special_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token in template and token != tokenizer.mask_token and isinstance(token_id, int):
                used.setdefault(token_id, f"chat-template token {token}")
    return used


class ModelHeads:
    """What the corrector reads of a model it does not decode through a :class:`Backbone`: E
    (input embeddings) and E_out (LM head rows), for a Qwen3-layout ``model``
    (``model.model.embed_tokens``, ``model.lm_head``), which SGLang's and transformers'
    modules share: the served model in SGLang, the AR target of a speculative decode."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None) -> None:
        inner = getattr(model, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        head = getattr(model, "lm_head", None)
        if embed is None or head is None or not hasattr(head, "weight"):
            raise RuntimeError(
                "corrector: the model has no model.embed_tokens / lm_head.weight "
                f"(a Qwen3-layout model is needed), got {type(model).__name__}"
            )
        if hasattr(head, "shard_indices") and head.weight.shape[0] < (vocab_size or 0):
            raise RuntimeError(
                "corrector: the LM head is sharded across tensor-parallel ranks; the head needs "
                "the whole vocabulary (tensor parallelism 1)"
            )
        self._embed, self._head = embed, head
        # SGLang pads the head's rows; the model's vocabulary is the unpadded size
        self.vocab_size = int(vocab_size) if vocab_size else int(head.weight.shape[0])
        self.hidden_size = int(head.weight.shape[1])
        self.device = head.weight.device

    def embed(self, ids: Tensor) -> Tensor:
        return self._embed(ids)  # type: ignore[no-any-return]

    def lm_head_rows(self, ids: Tensor) -> Tensor:
        return self._head.weight[ids]  # type: ignore[no-any-return]
