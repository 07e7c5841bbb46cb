"""How to decode with ISD, declared once: :class:`DecodeOptions` and :class:`ISDOptions`.

:class:`DecodeOptions` holds what every ISD decode is asked, wherever it runs: the stride N, the
temperature, K and the head's role. Its two users add their own fields to it:

- :class:`ISDOptions` (brisk's loop, :func:`brisk.runtime.isd.decode`): the token budget, the
  EOS id and the diagnostics' block scores;
- :class:`~brisk.runtime.serving.options.BriskISDOptions` (the SGLang algorithm ``BRISK_ISD``):
  the corrector's checkpoint, its kernel, the block-log directory and the default seed.

A field's name, type, default, check and documentation live here; the flags of ``brisk decode``
and ``brisk serve`` are derived from them (:func:`brisk.cli._common.add_config_arguments`), and
so is the ``$BRISK_ISD_CONFIG`` mapping. This module imports nothing heavy, so the command line
builds its parsers without torch (:class:`ISDOptions` is re-exported by :mod:`brisk.runtime.isd`,
which does import it).

>>> ISDOptions(stride=8).M, ISDOptions().greedy
(7, True)
>>> ISDOptions(stride=1)
Traceback (most recent call last):
ValueError: stride: need an integer N ≥ 2, got 1
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from brisk.runtime.configs import Config

__all__ = ["DecodeOptions", "ISDOptions"]

_TOP_K_0 = (
    " (0 does not mean 'no limit' here: drafts at T > 0 are drawn from q restricted to its "
    "Top-K, so pass the vocabulary size for untruncated drafts)"
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DecodeOptions(Config):
    """What every ISD decode is asked (module docstring). A bad value is one error naming the
    field, of the class's ``error`` type."""

    error: ClassVar[type[ValueError]] = ValueError

    stride: int = 4  # ISD stride N: blocks of M = N − 1 proposals
    temperature: float = 0.0  # 0: greedy; T > 0 samples from p at T, verified exactly
    top_k: int = 16  # K: candidates per MASK position when no corrector sets it
    shadow: bool = False  # run the corrector beside the base for the block log; the base drafts

    def __post_init__(self) -> None:
        super().__post_init__()
        t = self.temperature
        number = isinstance(t, int | float) and not isinstance(t, bool)
        self.need(_is_int(self.stride) and self.stride >= 2, "stride", "need an integer N ≥ 2")
        finite = not number or math.isfinite(t)
        self.need(
            number and finite and t >= 0,
            "temperature",
            "need a number ≥ 0" + ("" if finite else " and finite"),
        )
        self.need(
            _is_int(self.top_k) and self.top_k >= 1,
            "top_k",
            "need an integer K ≥ 1 (candidates per MASK position)",
            _TOP_K_0 if self.top_k == 0 else "",
        )
        self.need(isinstance(self.shadow, bool), "shadow", "need true or false")

    def need(self, ok: bool, name: str, what: str, why: str = "") -> None:
        """Raise ``error("name: what, got value why")`` unless ``ok``."""
        if not ok:
            raise self.error(f"{name}: {what}, got {getattr(self, name)!r}{why}")

    @property
    def M(self) -> int:
        return self.stride - 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class ISDOptions(DecodeOptions):
    """How brisk's loop decodes: :class:`DecodeOptions` and the budget, the EOS id and the
    diagnostics' block scores. ``temperature`` 0 is greedy."""

    # token budget per request (brisk decode lowers the default to what fits the model's positions)
    max_new_tokens: int = 256
    eos_token_id: int | None = None  # stop after this token (None: at the budget only)
    # diagnostics: score the base and head blocks of every verify round under the verifier for
    # the log's base_logp / head_logp (eq:mech_block_logp); one extra forward per round, which
    # the statistics do not count
    score_blocks: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(
            _is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
            "max_new_tokens",
            "need an integer ≥ 1",
        )
