"""The options of brisk's SGLang algorithms, and the plugin config that carries them.

The decode's own fields are :mod:`brisk.runtime.decode_options`', declared once for
``brisk decode`` and the server: :class:`ServedOptions` adds what both algorithms serve by (the
seed of requests that bring none) to the sampling options, :class:`BriskISDOptions`
(``BRISK_ISD``) extends it and :class:`~brisk.runtime.decode_options.DecodeOptions`, and
``BRISK_DRAFTER``'s (:mod:`brisk.runtime.serving.drafter_options`) extends it with the drafter.
``brisk serve``'s flags are derived from these fields. Every key is checked here, before the
server loads a model: an unknown key, a wrong type or a corrector built for another M is one
line naming the option (:class:`OptionError`).

**The plugin config.** The options reach SGLang as the served model's config key ``brisk``
(:data:`PLUGIN_KEY`), set by SGLang's own ``--json-model-override-args``, which is how a launch
hands every SGLang process a setting for the model's code (``brisk serve`` writes it;
:func:`brisk.runtime.serving.launch.server_arguments`). SGLang's argument resolution and the
worker both read the model's config, so the plugin reads its options from there
(:meth:`ServedOptions.of_model`): a mapping of options, or the path of a YAML / JSON file
holding one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Self

from brisk.runtime.decode_options import IMPLS, DecodeOptions, Impl, SamplingOptions, is_int

__all__ = ["PLUGIN_KEY", "BriskISDOptions", "OptionError", "ServedOptions", "plugin_config"]

PLUGIN_KEY = "brisk"
"""The served model's config key that holds the algorithm's options (module docstring)."""


class OptionError(ValueError):
    """An option the server cannot start with; the message names the option."""


def plugin_config(model_config: Any) -> dict[str, Any] | None:
    """The options in the served model's config (an HF config: SGLang's ``hf_config``, its
    ``--json-model-override-args`` applied) under :data:`PLUGIN_KEY`, read from the file it
    names where it names one; None when it holds none."""
    given = getattr(model_config, PLUGIN_KEY, None)
    if given is None:
        return None
    where = f"{PLUGIN_KEY} (the model config's, --json-model-override-args)"
    if isinstance(given, str):
        try:
            text = Path(given).read_text()
        except OSError as err:
            raise OptionError(f"{where}: cannot read {given} ({err.strerror})") from None
        if given.endswith(".json"):
            given = json.loads(text)
        else:
            import yaml

            given = yaml.safe_load(text) or {}
    if not isinstance(given, dict):
        raise OptionError(f"{where}: need a mapping of options or a file of one, got {given!r}")
    return given


@dataclass(frozen=True)
class ServedOptions(SamplingOptions):
    """What brisk's SGLang algorithms serve by: the sampling options (the server's temperature,
    which every request must ask for) and the seed of requests that bring none. A bad value is
    an :class:`OptionError` naming the option."""

    error: ClassVar[type[ValueError]] = OptionError
    label: ClassVar[str] = "brisk"  # the algorithm, as an unknown option's error names it

    seed: int = 0  # the seed of requests that bring none

    def __post_init__(self) -> None:
        super().__post_init__()
        self.need(is_int(self.seed), "seed", "need an integer")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | None) -> Self:
        """From the plugin config's mapping: an unknown key is one line naming it."""
        config = dict(config or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise OptionError(
                f"{unknown[0]}: unknown {cls.label} option (known: {', '.join(sorted(known))})"
            )
        return cls(**config)

    @classmethod
    def of_model(cls, model_config: Any) -> Self:
        """The options in the served model's config (:func:`plugin_config`)."""
        return cls.from_mapping(plugin_config(model_config))


@dataclass(frozen=True)
class BriskISDOptions(ServedOptions, DecodeOptions):
    """:class:`~brisk.runtime.decode_options.DecodeOptions` (``stride`` N, SGLang's block being
    2N − 1 slots; ``temperature``; ``top_k`` K when no corrector sets it; ``shadow``), the seed
    and the server's own options below."""

    label: ClassVar[str] = "BriskISD"

    corrector: str | None = None  # a corrector checkpoint directory (Corrector.from_pretrained)
    impl: Impl = "auto"  # the head's step (auto: Triton on CUDA)
    # a directory for the block log (Parquet, the brisk mechanism format), written by TP rank 0
    log_blocks: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        path = self.corrector is None or isinstance(self.corrector, str)
        self.need(path, "corrector", "need a path")
        self.need(self.impl in IMPLS, "impl", "need auto, naive or triton")
        logs = self.log_blocks is None or isinstance(self.log_blocks, str)
        self.need(logs, "log_blocks", "need a path")
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
    def block_size(self) -> int:
        """SGLang's block: ``[pending, x_1..x_M, MASK×M]``, 2N − 1 slots."""
        return 2 * self.stride - 1

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any] | None) -> Self:
        """From the plugin config's mapping. SGLang's own ``block_size`` key is derived here
        (2N − 1), so it is accepted only when it agrees; ``top_k`` beside a corrector only when
        it is the corrector's K."""
        config = dict(config or {})
        block_size = config.pop("block_size", None)
        options = super().from_mapping(config)
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
