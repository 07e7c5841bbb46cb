"""The drafter family of verified parallel decoders: a DFlash-shaped block drafter conditioned
on an autoregressive target's hidden states (:mod:`~brisk.runtime.drafter.model`) and the
speculative decoding loop that verifies its blocks exactly, with the corrector drafting over
the drafter's Top-K when one is given (:mod:`~brisk.runtime.drafter.speculative`), and the
target's plain decoding that both are measured against (:mod:`~brisk.runtime.drafter.plain`)."""

from __future__ import annotations

from brisk.runtime.drafter.model import (
    DFlashDrafter,
    DrafterSpec,
    build_target_layer_ids,
    drafter_config,
    load_drafter,
    save_drafter,
    write_drafter,
)
from brisk.runtime.drafter.plain import plain_decode
from brisk.runtime.drafter.speculative import (
    SDOptions,
    SDOutput,
    SDResult,
    check_head,
    check_pair,
    position_limit,
    speculative_decode,
    target_heads,
)

__all__ = [
    "DFlashDrafter",
    "DrafterSpec",
    "SDOptions",
    "SDOutput",
    "SDResult",
    "build_target_layer_ids",
    "check_head",
    "check_pair",
    "drafter_config",
    "load_drafter",
    "plain_decode",
    "position_limit",
    "save_drafter",
    "speculative_decode",
    "target_heads",
    "write_drafter",
]
