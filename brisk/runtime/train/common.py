"""What the training loops share beyond resuming (:mod:`brisk.runtime.train.resume`): the
result of a run of steps, AdamW as every loop builds it, a run's CPU settings, the tokens
of a run that trains from a checkpoint (its MASK id, resolved once for base and proposal
training, and the row ``--add-mask-token`` gives it), and the loss weights of the
position-weighting schemes proposal and drafter training offer."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from brisk.runtime.train.fields import MaskToken
from brisk.theory import CostModel, decay_weights, dpace_weights, progress_weights, uniform_weights

__all__ = [
    "TrainingTokens",
    "adamw",
    "carry_mask",
    "cpu_settings",
    "init_tokens",
    "scheme_weights",
]


def adamw(model: Any, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (β = 0.9, 0.98) without decay on norms and biases (1-D tensors), the usual GPT
    recipe; for an FSDP model build it after sharding (its parameters are then DTensors)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98))


@contextmanager
def cpu_settings(threads: int) -> Iterator[None]:
    """Thread count and denormal flushing for the run, restored afterwards (tests share a
    process)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # denormal weights/activations can slow CPU matmuls many-fold
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)


@dataclass(frozen=True)
class TrainingTokens:
    """The tokenizer a run trains with, the MASK id its batches are laid out with and the
    padding id (never attended or scored: the pad token, else EOS)."""

    tokenizer: Any
    mask_id: int
    pad_id: int


def init_tokens(init: str | Path, mask: MaskToken, where: str = "--init") -> TrainingTokens:
    """The tokens of a run that trains from the checkpoint ``init``: its tokenizer, with
    ``<|MASK|>`` added when ``mask.add_mask_token`` asks (every rank adds it the same way, so
    the ids agree; :func:`carry_mask` grows the model to it), and the MASK id of
    :func:`~brisk.runtime.loader.checkpoint_mask_id` (``mask.mask_token_id`` first), resolved
    and checked before anything is written."""
    from brisk.runtime.backbone import MASK_TOKEN
    from brisk.runtime.loader import checkpoint_mask_id, load_tokenizer

    if not (Path(init) / "config.json").is_file():
        raise ValueError(f"{where}: {init} is not a checkpoint (no config.json)")
    tokenizer = load_tokenizer(init, where=where)
    if mask.add_mask_token:  # the tokenizer's side of add_mask_token (the model's: carry_mask)
        existing = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
        if isinstance(existing, int) and existing != tokenizer.unk_token_id:
            tokenizer.mask_token = MASK_TOKEN
        else:
            tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        mask_id = int(tokenizer.mask_token_id)
    else:
        mask_id = checkpoint_mask_id(init, mask.mask_token_id, tokenizer=tokenizer, where=where)
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    if pad_id is None:
        raise ValueError(f"{where}: {init}'s tokenizer has neither a pad nor an EOS token")
    return TrainingTokens(tokenizer, mask_id, int(pad_id))


def carry_mask(model: Any, tokens: TrainingTokens, add: bool) -> None:
    """Make ``model`` carry the run's MASK token into every checkpoint it is saved to: with
    ``add`` its embeddings (and LM head, when untied) grow by the added token's row, at the
    mean of the others (:func:`~brisk.runtime.architectures.add_mask_token`); either way its
    config records ``mask_token_id``, so every later command finds the id without a flag."""
    from brisk.runtime.architectures import add_mask_token

    if add:
        add_mask_token(model, tokens.tokenizer)
    model.config.mask_token_id = tokens.mask_id


def scheme_weights(
    scheme: str,
    M: int,
    cost: CostModel,
    *,
    rates: Any = None,
    token_probs: torch.Tensor | None = None,
    alpha: float = 0.5,
    gamma: float = 7.0,
) -> torch.Tensor:
    """The loss weights of a position-weighting scheme, mean one, float64: ``[M]``, or
    ``[..., M]`` for D-PACE.

    - ``brisk``: :func:`~brisk.theory.progress_weights` of the acceptance rates ``rates [M]``
      (no NaN: a complete profile) under ``cost`` (eq:brisk_weighting);
    - ``uniform``: all ones;
    - ``decay``: DFlash's exp(−(k − 1)/γ);
    - ``dpace``: D-PACE (with ``alpha``) from the model's probability of each target token,
      ``token_probs [..., M]``.
    """
    if scheme == "brisk":
        if rates is None or bool(torch.as_tensor(rates).isnan().any()):
            raise ValueError(f"rates: BRISK weights need a complete profile, got {rates!r}")
        return torch.as_tensor(progress_weights(rates, cost))
    if scheme == "uniform":
        return torch.as_tensor(uniform_weights(M))
    if scheme == "decay":
        return torch.as_tensor(decay_weights(M, gamma))
    if scheme == "dpace":
        if token_probs is None:
            raise ValueError("token_probs: D-PACE weights need each target token's probability")
        return dpace_weights(token_probs.detach().double().clamp(0, 1), alpha)
    raise ValueError(f"weights: expected brisk, uniform, dpace or decay, got {scheme!r}")
