"""The frozen target's features of a drafter dataset, computed once and read back.

A drafter step runs its target over the batch's responses only to read the hidden states of the
target layers the drafter conditions on (:meth:`~brisk.runtime.drafter.DFlashDrafter.features`):
the target is frozen, so these features are a function of the example alone. On a CPU the
target's forward is most of a step (SmolLM2-135M: about 50 s of a one-core step on 16 responses,
the drafter's share a few seconds), and every arm of an experiment (weightings × seeds) trains
on the same dataset. With ``feature_cache = DIR`` they are computed once, each example alone (no
padding), into ``DIR/<key>/``, and every run with the same key reads them:

- ``features.npy``: float32 ``[Σ L_i, k·H]``, the examples' rows end to end (memory-mapped);
- ``offsets.npy``: int64 ``[n + 1]``, where example ``i``'s rows start and end;
- ``meta.json``: the key's parts (target checkpoint and tokenizer hashes, the layer ids, the
  examples' token ids hash, the position limit).

The key is a hash of all of them, so another target, tokenizer, dataset selection or layer set
is another directory. A directory is written beside its final name and renamed into place, so an
interrupted build leaves nothing a later run would read. Storage is ``4 · k · H`` bytes a token
for ``k`` target layers of width ``H`` (SmolLM2 with a one-layer drafter, which reads one target
layer: 2.3 kB; its 384 responses of 316 tokens: 281 MB).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["TargetFeatures", "feature_key"]


def feature_key(parts: dict[str, Any]) -> str:
    """16 hex digits of sha256 over ``parts`` (JSON, sorted keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class TargetFeatures:
    """The cached features of one dataset (module docstring); :meth:`batch` pads them into a
    step's ``[B, S, k·H]``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.offsets = np.load(directory / "offsets.npy")
        self.data = np.load(directory / "features.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def length(self, i: int) -> int:
        return int(self.offsets[i + 1] - self.offsets[i])

    def batch(self, indices: Sequence[int], S: int, device: torch.device) -> torch.Tensor:
        """Examples ``indices``' features, each cut to ``S`` rows and zero-padded to it: what a
        target forward of the right-padded batch gives at every real position (a drafter never
        attends to a padding position)."""
        out = torch.zeros(len(indices), S, self.data.shape[1], dtype=torch.float32)
        for b, i in enumerate(indices):
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            n = min(hi - lo, S)
            out[b, :n] = torch.from_numpy(np.array(self.data[lo : lo + n]))
        return out.to(device)

    @classmethod
    def open_or_build(
        cls,
        root: Path,
        parts: dict[str, Any],
        sequences: Sequence[Sequence[int]],
        target: Any,
        layer_ids: Sequence[int],
        *,
        build: bool = True,
        show_progress: bool = True,
    ) -> TargetFeatures:
        """The cache of ``parts`` under ``root``, built first when absent and ``build`` (one
        target forward per sequence); ``build=False`` (the ranks other than 0, after rank 0
        built it) only opens it."""
        directory = root / feature_key(parts)
        if (directory / "meta.json").is_file():
            return cls(directory)
        if not build:
            raise ValueError(f"feature_cache: {directory} was not built")
        device = next(target.parameters()).device
        total = sum(len(s) for s in sequences)
        width = len(layer_ids) * int(target.config.hidden_size)
        mine = directory.with_name(f".{directory.name}.{os.getpid()}")
        shutil.rmtree(mine, ignore_errors=True)
        mine.mkdir(parents=True)
        offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sequences], out=offsets[1:])
        data = np.lib.format.open_memmap(
            mine / "features.npy", mode="w+", dtype=np.float32, shape=(total, width)
        )
        progress = Progress(
            TextColumn("target features"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not show_progress,
        )
        with progress, torch.no_grad():
            bar = progress.add_task("features", total=len(sequences))
            for i, seq in enumerate(sequences):
                ids = torch.as_tensor([list(seq)], device=device)
                out = target(input_ids=ids, output_hidden_states=True, logits_to_keep=1)
                rows = torch.cat([out.hidden_states[k + 1] for k in layer_ids], dim=-1)[0]
                data[offsets[i] : offsets[i + 1]] = rows.float().cpu().numpy()
                progress.advance(bar)
        data.flush()
        del data
        np.save(mine / "offsets.npy", offsets)
        (mine / "meta.json").write_text(json.dumps({**parts, "tokens": total}, indent=1))
        try:
            mine.rename(directory)
        except OSError:  # another process finished the same cache first: keep its copy
            shutil.rmtree(mine, ignore_errors=True)
        return cls(directory)
