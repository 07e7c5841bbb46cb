"""The proposal ablation in its micro form (``tests/runtime/test_experiment_proposal.py``'s), end
to end from a micro base (150 steps), two seeds, the base and two trained arms; writes the
experiment's records without their wall-clock fields to ``OUT/records.json``.

A refactor that must not change a number runs it before and after, on the same machine, and
compares the two files byte for byte (issue 41: identical). It imports the brisk on
``PYTHONPATH``; it reads the layout of either side of issue 41's moves.

    PYTHONPATH=. .venv/bin/python benchmarks/micro_experiment_records.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    out = Path(sys.argv[1])
    try:
        from brisk.runtime.train.base.config import BaseTrainConfig
        from brisk.runtime.train.base.recipe import train_base
    except ImportError:
        from brisk.runtime.train.config import BaseTrainConfig

        from brisk.runtime.train.base import train_base
    try:
        from brisk.experiments.proposal import ExperimentConfig, run_experiment
    except ImportError:
        from brisk.runtime.experiment.proposal import ExperimentConfig, run_experiment
    from tests.runtime.conftest import micro_experiment_toml

    base = train_base(
        BaseTrainConfig.smoke(str(out / "base")).replace(steps=150), show_progress=False
    ).checkpoint
    arms = ["base", "selfgen-correct-uniform", "selfgen-correct-dynamic"]
    (out / "exp.toml").write_text(micro_experiment_toml(out / "exp", base, [0, 1], arms, workers=1))
    summary = run_experiment(ExperimentConfig.load(out / "exp.toml"), show_progress=False)

    def timeless(x: Any) -> Any:
        if isinstance(x, dict):
            return {
                k: timeless(v)
                for k, v in x.items()
                if not any(t in k for t in ("_s", "per_s", "wall", "time", "tokens_per"))
            }
        if isinstance(x, list):
            return [timeless(v) for v in x]
        return x

    records = {
        "evals": timeless(summary["evals"]),
        "arms": timeless(summary["arms"]),
        "best_arm": summary["best_arm"],
        "theory": timeless(summary.get("theory")),
    }
    (out / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True, default=str))
    print("wrote", out / "records.json")


if __name__ == "__main__":
    main()
