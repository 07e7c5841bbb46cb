"""The options of the ``BRISK_ISD`` SGLang algorithm, read from ``$BRISK_ISD_CONFIG`` (a YAML or
JSON file, or a JSON object: :func:`brisk.runtime.serving.worker.load_options`).

The decode's own fields are :class:`~brisk.runtime.decode_options.DecodeOptions`', declared once
for ``brisk decode`` and the server; ``brisk serve``'s ISD flags are derived from these. Every
key is checked here, before the server loads a model: an unknown key, a wrong type or a
corrector built for another M is one line naming the option (:class:`OptionError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from brisk.runtime.decode_options import DecodeOptions, ISDOptions

__all__ = ["BriskISDOptions", "OptionError"]


class OptionError(ValueError):
    """A ``BriskISD`` option the server cannot start with; the message names the option."""


IMPL = Literal["auto", "naive", "triton"]


@dataclass(frozen=True)
class BriskISDOptions(DecodeOptions):
    """:class:`~brisk.runtime.decode_options.DecodeOptions` (``stride`` N, SGLang's block being
    2N − 1 slots; ``temperature``, which every request must ask for; ``top_k`` K when no
    corrector sets it; ``shadow``) and the server's own options below."""

    error: ClassVar[type[ValueError]] = OptionError

    corrector: str | None = None  # a corrector checkpoint directory (Corrector.from_pretrained)
    impl: IMPL = "auto"  # the head's step (auto: Triton on CUDA)
    # a directory for the block log (Parquet, the brisk mechanism format), written by TP rank 0
    log_blocks: str | None = None
    seed: int = 0  # the seed of requests that bring none

    def __post_init__(self) -> None:
        super().__post_init__()
        path = self.corrector is None or isinstance(self.corrector, str)
        self.need(path, "corrector", "need a path")
        self.need(self.impl in get_args(IMPL), "impl", "need auto, naive or triton")
        logs = self.log_blocks is None or isinstance(self.log_blocks, str)
        self.need(logs, "log_blocks", "need a path")
        self.need(
            isinstance(self.seed, int) and not isinstance(self.seed, bool),
            "seed",
            "need an integer",
        )
        if self.shadow and self.corrector is None:
            raise OptionError("shadow: needs a corrector to run beside the base")
        if self.corrector is not None and not (Path(self.corrector) / "config.json").is_file():
            raise OptionError(f"corrector: {self.corrector} holds no corrector checkpoint")

    def decode_options(self, **changes: Any) -> ISDOptions:
        """The :class:`ISDOptions` of this server's decode step: the shared fields, ``changes``
        on top (the corrector's K as ``top_k``)."""
        shared = {f.name: getattr(self, f.name) for f in fields(DecodeOptions)}
        return ISDOptions(**{**shared, **changes})

    def corrector_config(self) -> dict[str, Any]:
        """The corrector checkpoint's config (M, K, hidden_size, vocab_size, …)."""
        if self.corrector is None:
            raise OptionError("corrector: not set")
        return dict(json.loads((Path(self.corrector) / "config.json").read_text()))

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
