"""How to decode: the options of an ISD run."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ISDOptions"]


@dataclass(frozen=True)
class ISDOptions:
    """How to decode. ``temperature`` 0 is greedy."""

    stride: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 256
    eos_token_id: int | None = None
    shadow: bool = False  # run the corrector beside the base for the logs, but decode head-off
    top_k: int = 16  # K: candidates per position when no corrector sets it (drafts and logs)
    # Diagnostics only: score the base and head blocks of every verify round under the verifier
    # for the logs' base_logp / head_logp (eq:mech_block_logp). Costs one extra forward per
    # round, which is not counted in the statistics.
    score_blocks: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stride, bool) or not isinstance(self.stride, int) or self.stride < 2:
            raise ValueError(f"stride: need an integer N ≥ 2, got {self.stride!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be ≥ 0, got {self.temperature!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an integer ≥ 1, got {self.max_new_tokens!r}")
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k: must be an integer ≥ 1, got {self.top_k!r}")

    @property
    def M(self) -> int:
        return self.stride - 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
