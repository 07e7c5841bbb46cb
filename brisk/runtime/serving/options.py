"""The options of the ``BriskISD`` SGLang algorithm, read from ``--dllm-algorithm-config x.yaml``.

Every key is checked here, before the server loads a model: an unknown key, a wrong type or a
corrector built for another M is one line naming the option (:class:`OptionError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["BriskISDOptions", "OptionError"]


class OptionError(ValueError):
    """A ``BriskISD`` option the server cannot start with; the message names the option."""


@dataclass(frozen=True)
class BriskISDOptions:
    """``stride`` N (blocks of M = N − 1 proposals; SGLang's block is 2N − 1 slots),
    ``temperature`` (0: greedy; every request must ask for the same), ``top_k`` K when no
    corrector sets it, ``corrector`` a checkpoint directory (``Corrector.from_pretrained``),
    ``shadow`` (run the head beside the base for the logs, decode head-off), ``impl`` of the
    head (``auto``: the fused Triton step on CUDA), ``log_blocks`` a directory for the block log
    (Parquet, the ``brisk mechanism`` format), ``seed`` for requests that bring none.
    """

    stride: int = 4
    temperature: float = 0.0
    top_k: int = 16
    corrector: str | None = None
    shadow: bool = False
    impl: str = "auto"
    log_blocks: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise OptionError(f"{name}: {what}, got {getattr(self, name)!r}")

        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        need(is_int(self.stride) and self.stride >= 2, "stride", "need an integer N ≥ 2")
        need(
            isinstance(self.temperature, int | float)
            and not isinstance(self.temperature, bool)
            and self.temperature >= 0,
            "temperature",
            "need a number ≥ 0",
        )
        need(is_int(self.top_k) and self.top_k >= 1, "top_k", "need an integer ≥ 1")
        need(self.corrector is None or isinstance(self.corrector, str), "corrector", "need a path")
        need(isinstance(self.shadow, bool), "shadow", "need true or false")
        need(self.impl in ("auto", "naive", "triton"), "impl", "need auto, naive or triton")
        need(
            self.log_blocks is None or isinstance(self.log_blocks, str), "log_blocks", "need a path"
        )
        need(is_int(self.seed), "seed", "need an integer")
        if self.shadow and self.corrector is None:
            raise OptionError("shadow: needs a corrector to run beside the base")
        if self.corrector is not None and not (Path(self.corrector) / "config.json").is_file():
            raise OptionError(f"corrector: {self.corrector} holds no corrector checkpoint")

    def corrector_config(self) -> dict[str, Any]:
        """The corrector checkpoint's config (M, K, hidden_size, vocab_size, …)."""
        if self.corrector is None:
            raise OptionError("corrector: not set")
        return dict(json.loads((Path(self.corrector) / "config.json").read_text()))

    @property
    def M(self) -> int:
        return self.stride - 1

    @property
    def block_size(self) -> int:
        """SGLang's block: ``[pending, x_1..x_M, MASK×M]``, 2N − 1 slots."""
        return 2 * self.stride - 1

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | None) -> BriskISDOptions:
        """From the algorithm config YAML's mapping. SGLang's own ``block_size`` key is derived
        here (2N − 1), so it is accepted only when it agrees."""
        config = dict(config or {})
        block_size = config.pop("block_size", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise OptionError(
                f"{unknown[0]}: unknown BriskISD option (known: {', '.join(sorted(known))})"
            )
        options = cls(**config)
        if options.corrector is not None:
            K = options.corrector_config().get("K")
            if "top_k" in config and config["top_k"] != K:
                raise OptionError(
                    f"top_k: the corrector at {options.corrector} ranks K = {K} candidates; "
                    f"drop top_k or set it to {K}, got {config['top_k']!r}"
                )
        if block_size is not None and block_size != options.block_size:
            raise OptionError(
                f"block_size: BriskISD's block is 2N − 1 = {options.block_size} slots at stride "
                f"{options.stride}; drop block_size or set it to that, got {block_size!r}"
            )
        return options
