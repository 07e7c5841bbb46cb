"""The options of the ``BRISK_DRAFTER`` SGLang algorithm and the launch-time checks of a
drafter against the served target, before SGLang starts (nothing here imports SGLang).

``BRISK_DRAFTER`` serves a DFlash-format block drafter (:mod:`brisk.runtime.drafter`) verified
by the served autoregressive target (:mod:`brisk.runtime.serving.drafter_worker`). Its options
reach SGLang's processes as the plugin config (:mod:`brisk.runtime.serving.options`): the
drafter's directory, the server's temperature (every request must ask for it), the Top-K of
sampled drafts and the seed of requests that bring none. SGLang's verify width is the drafter's
block (:func:`drafter_flags`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Self

from brisk.runtime.serving.options import OptionError, ServedOptions

__all__ = [
    "DRAFTER_ALGORITHM",
    "BriskDrafterOptions",
    "check_drafter_pair",
    "drafter_block_size",
    "drafter_flags",
]

DRAFTER_ALGORITHM = "BRISK_DRAFTER"


@dataclass(frozen=True)
class BriskDrafterOptions(ServedOptions):
    """:class:`~brisk.runtime.serving.options.ServedOptions` (``temperature``: the target's,
    which every request must ask for; 0: greedy, the served answers are the target's greedy
    decoding token for token; ``top_k``: at T > 0 the drafts are draws from the drafter's
    softmax restricted to its Top-K, ISD's proposal law, draft ``top-k`` of ``brisk decode
    --drafter``; ``seed``) and the drafter."""

    label: ClassVar[str] = DRAFTER_ALGORITHM

    # a DFlash drafter checkpoint directory (its block size is SGLang's verify width)
    drafter: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(isinstance(self.drafter, str) and bool(self.drafter), "drafter", "need a path")
        if not (Path(self.drafter) / "config.json").is_file():
            raise OptionError(f"drafter: {self.drafter} holds no drafter checkpoint (config.json)")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | None) -> Self:
        """From the plugin config's mapping: an unknown key or a missing drafter is one line
        naming it."""
        config = dict(config or {})
        if "drafter" not in config and set(config) <= {f.name for f in fields(cls)}:
            raise OptionError(f"drafter: {DRAFTER_ALGORITHM} needs a drafter checkpoint directory")
        return super().from_mapping(config)


def drafter_block_size(drafter: str | os.PathLike[str]) -> int:
    """The drafter's block (anchor + M proposals): SGLang's verify width."""
    from brisk.runtime.drafter import load_drafter

    return load_drafter(Path(drafter), device="meta").spec.block_size


def drafter_flags(block_size: int) -> tuple[str, ...]:
    """SGLang's flags for ``BRISK_DRAFTER`` with a drafter of ``block_size`` slots: a chain
    (top-k 1) ``[pending, d_1..d_{B−1}]`` verified in one forward, run synchronously (no
    overlap), no radix cache (the drafter's context is the features the server computed for
    each request's own tokens; a prefix shared from the cache would come without them) and no
    CUDA graphs (the target's graphs are captured before the worker asks the model for the
    drafter's layers, so a replayed forward would return none).

    >>> drafter_flags(4)[:4]
    ('--speculative-algorithm', 'BRISK_DRAFTER', '--speculative-num-draft-tokens', '4')
    """
    return (
        "--speculative-algorithm",
        DRAFTER_ALGORITHM,
        "--speculative-num-draft-tokens",
        str(block_size),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-steps",
        str(block_size - 1),
        "--disable-overlap-schedule",
        "--disable-radix-cache",
        "--cuda-graph-backend-decode",
        "disabled",
        "--cuda-graph-backend-prefill",
        "disabled",
    )


def check_drafter_pair(target_config: Any, drafter: str | os.PathLike[str]) -> int:
    """That the drafter at ``drafter`` was built for a target of ``target_config`` (an HF
    config): its checkpoint loads (:func:`~brisk.runtime.drafter.load_drafter`) and
    :func:`~brisk.runtime.drafter.check_pair` holds against the target built on the meta device
    (its config and LM head, no weights). One ``ValueError`` line naming the first mismatch;
    returns the drafter's block size."""
    import torch
    from transformers import AutoModelForCausalLM

    from brisk.runtime.drafter import check_pair, load_drafter

    draft = load_drafter(Path(drafter), device="meta")
    try:
        with torch.device("meta"):
            target = AutoModelForCausalLM.from_config(target_config)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"model: cannot build the target to check the drafter ({err})") from None
    check_pair(target, draft)
    positions = getattr(target_config, "max_position_embeddings", None)
    block = draft.spec.block_size
    if positions is not None and block + 1 > int(positions):
        raise ValueError(
            f"drafter: a block of {block} slots after a request's tokens; the target has "
            f"{positions} positions"
        )
    return block
