"""Shared runtime fixtures: a micro base model trained for seconds and its self-generated data."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisk.runtime.train.selfgen import SelfGenOptions

# Small enough for the suite: 40 problems × 2 samples of the trivial task at stride 4.
MICRO_SELFGEN = SelfGenOptions(problems=40, samples=2, stride=4, max_new_tokens=24, chunk=16)


@pytest.fixture(scope="session")
def micro_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro I-DLM base on the trivial task (150 steps, ~10 s): it answers some problems."""
    from brisk.runtime.train.base import train_base
    from brisk.runtime.train.config import BaseTrainConfig

    out = tmp_path_factory.mktemp("micro_base")
    cfg = BaseTrainConfig.smoke(str(out)).replace(steps=150)
    return train_base(cfg, show_progress=False).checkpoint


@pytest.fixture(scope="session")
def micro_dataset(micro_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from brisk.runtime.train.selfgen import generate_dataset

    out = tmp_path_factory.mktemp("selfgen") / "data"
    generate_dataset(micro_base, out, MICRO_SELFGEN, show_progress=False)
    return out
