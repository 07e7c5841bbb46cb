"""Bad input raises ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
    decay_weights,
    dpace_weights,
    expected_forwards,
    isd_tpf_uniform,
    predict_run_tpf,
    progress_weights,
    run_tpf,
    simulate,
    simulate_run,
    speculative_tpf_uniform,
    survival,
    tokens_per_second,
    tpf,
)

nan = float("nan")
P = AcceptanceProfile.from_accept_lengths([0, 1, 2], 2)

CASES: list[Any] = [
    pytest.param(lambda: tpf([0.5, nan]), "a", id="nan"),
    pytest.param(lambda: tpf(torch.tensor([0.5, nan])), "a", id="nan-torch"),
    pytest.param(lambda: tpf([0.5, 1.2]), "a", id="above-one"),
    pytest.param(lambda: survival([-0.1]), "a", id="below-zero"),
    pytest.param(lambda: tpf([]), "a", id="M0"),
    pytest.param(lambda: tpf(np.zeros((3, 0))), "a", id="M0-batched"),
    pytest.param(lambda: tpf(0.5), "a", id="scalar"),
    pytest.param(lambda: tpf(["x", "y"]), "a", id="strings"),
    pytest.param(lambda: tpf([[0.5, 0.5], [0.5]]), "a", id="ragged"),
    pytest.param(lambda: tpf([0.5] * 3, CostModel.isd(4)), "cost", id="cost-M"),
    pytest.param(lambda: tpf([0.5], "isd"), "cost", id="cost-type"),
    pytest.param(lambda: CostModel((1.0,), (1.0,)), "gains", id="gains-short"),
    pytest.param(lambda: CostModel((1.0, 2.0), (1.0,)), "costs", id="costs-length"),
    pytest.param(lambda: CostModel((1.0, float("inf")), (1.0, 1.0)), "gains", id="gains-inf"),
    pytest.param(lambda: CostModel((1.0, 2.0), (1.0, 0.0)), "costs", id="costs-zero"),
    pytest.param(lambda: CostModel.isd(0), "M", id="isd-M0"),
    pytest.param(lambda: CostModel.speculative(3, -1.0), "draft_cost", id="draft-cost"),
    pytest.param(lambda: isd_tpf_uniform(0.1, 1), "stride", id="stride"),
    pytest.param(lambda: isd_tpf_uniform([0.1, 1.5], 8), "r", id="r"),
    pytest.param(lambda: speculative_tpf_uniform(-0.1, 3), "alpha", id="alpha"),
    pytest.param(lambda: speculative_tpf_uniform(0.5, 0), "M", id="sd-M0"),
    pytest.param(lambda: progress_weights([0.5], method="fd"), "method", id="method"),  # type: ignore[call-overload]
    pytest.param(lambda: progress_weights([0.5], eps=-1.0), "eps", id="eps"),
    pytest.param(lambda: progress_weights([[0.5, nan]]), "a", id="weights-nan"),
    pytest.param(lambda: dpace_weights([[0.5, 2.0]]), "token_probs", id="dpace-probs"),
    pytest.param(lambda: dpace_weights([0.5], alpha=2.0), "alpha", id="dpace-alpha"),
    pytest.param(lambda: decay_weights(0), "M", id="decay-M0"),
    pytest.param(lambda: decay_weights(3, gamma=0.0), "gamma", id="decay-gamma"),
    pytest.param(lambda: AcceptanceProfile.from_accept_lengths([0, 8], 7), "lengths", id="L>M"),
    pytest.param(lambda: AcceptanceProfile.from_accept_lengths([-1], 7), "lengths", id="L<0"),
    pytest.param(lambda: AcceptanceProfile.from_accept_lengths([0.5], 3), "lengths", id="L-frac"),
    pytest.param(lambda: AcceptanceProfile.from_matches([[0, 2]]), "matches", id="matches"),
    pytest.param(lambda: AcceptanceProfile([1, 2], [2, 2]), "accepted", id="acc>reached"),
    pytest.param(lambda: AcceptanceProfile([1, 2], [1]), "accepted", id="acc-shape"),
    pytest.param(lambda: AcceptanceProfile([], []), "reached", id="profile-M0"),
    pytest.param(lambda: P + AcceptanceProfile.empty(3), "other", id="merge-M"),
    pytest.param(lambda: P.interval(level=1.0), "level", id="level"),
    pytest.param(lambda: P.tpf_interval(draws=0), "draws", id="draws"),
    pytest.param(lambda: P.tpf_interval(CostModel.isd(3)), "cost", id="interval-cost"),
    pytest.param(lambda: simulate([0.5], n_cycles=0), "n_cycles", id="n_cycles"),
    pytest.param(lambda: expected_forwards([0.5], -1), "n_max", id="n_max"),
    pytest.param(lambda: expected_forwards([0.5], 2.0), "n_max", id="n_max-float"),  # type: ignore[call-overload]
    pytest.param(lambda: expected_forwards([1.5], 3), "a", id="horizon-a"),
    pytest.param(lambda: run_tpf([0.5], []), "lengths", id="lengths-empty"),
    pytest.param(lambda: run_tpf([0.5], [3, 0]), "lengths", id="lengths-0"),
    pytest.param(lambda: run_tpf([0.5], [2.5]), "lengths", id="lengths-frac"),
    pytest.param(lambda: run_tpf([], [3]), "a", id="run-tpf-M0"),
    pytest.param(lambda: simulate_run([0.5], [-1]), "lengths", id="sim-lengths"),
    pytest.param(lambda: predict_run_tpf([0.5], [3]), "profile", id="predict-profile"),  # type: ignore[arg-type]
    pytest.param(lambda: predict_run_tpf(P, [3], level=0.0), "level", id="predict-level"),
    pytest.param(lambda: predict_run_tpf(P, [3], draws=0), "draws", id="predict-draws"),
    pytest.param(lambda: predict_run_tpf(P, []), "lengths", id="predict-lengths"),
    pytest.param(lambda: ProfileTracker(3, decay=1.0), "decay", id="tracker-decay"),
    pytest.param(lambda: ProfileTracker(3).update(P), "batch", id="tracker-M"),
    pytest.param(lambda: tokens_per_second(0.0, 0.02), "tpf", id="tps-tpf"),
    pytest.param(lambda: tokens_per_second(2.0, -0.02), "forward_s", id="tps-forward"),
    pytest.param(lambda: tokens_per_second(2.0, 0.02, overhead_s=nan), "overhead_s", id="tps-nan"),
    pytest.param(lambda: tokens_per_second([2.0] * 3, [0.1] * 2), "forward_s", id="tps-shape"),
]


@pytest.mark.parametrize(("call", "argument"), CASES)
def test_bad_input_names_the_argument(call: Callable[[], object], argument: str) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        call()


@pytest.mark.parametrize("a", [[0.0, 1.0], [1.0, 0.0], [0.0], [1.0]], ids=["0-1", "1-0", "0", "1"])
def test_zero_and_one_are_legal_everywhere(a: list[float]) -> None:
    assert np.isfinite(tpf(a))
    assert np.isfinite(progress_weights(a)).all()
    assert np.isfinite(progress_weights(a, method="autodiff")).all()
    assert np.isfinite(simulate(a, n_cycles=10).tpf)
