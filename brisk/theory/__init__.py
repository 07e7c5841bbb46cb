"""Renewal-reward theory of verified parallel decoding.

Paper: the section of fig:tpf_rejection, sec:proposal_learning (eq:nonuniform_tpf,
eq:brisk_weighting) and app:training_details (eq:idlm_tpf_instantiation);
:mod:`brisk.theory.horizon` adds the finite-horizon (whole-run) TPF that a decoder measures.
"""

from __future__ import annotations

from brisk.theory.horizon import (
    RunSimulation,
    RunTPFPrediction,
    expected_forwards,
    predict_run_tpf,
    run_tpf,
    simulate_run,
)
from brisk.theory.profile import AcceptanceProfile, ProfileTracker, TPFInterval
from brisk.theory.simulate import SimulationResult, simulate
from brisk.theory.throughput import break_even_overhead, tokens_per_second, wall_clock_speedup
from brisk.theory.tpf import (
    CostModel,
    accept_length_pmf,
    expected_accept_length,
    fpt,
    isd_tpf_uniform,
    speculative_tpf_uniform,
    survival,
    tpf,
)
from brisk.theory.weights import decay_weights, dpace_weights, progress_weights, uniform_weights

__all__ = [
    "AcceptanceProfile",
    "CostModel",
    "ProfileTracker",
    "RunSimulation",
    "RunTPFPrediction",
    "SimulationResult",
    "TPFInterval",
    "accept_length_pmf",
    "break_even_overhead",
    "decay_weights",
    "dpace_weights",
    "expected_accept_length",
    "expected_forwards",
    "fpt",
    "isd_tpf_uniform",
    "predict_run_tpf",
    "progress_weights",
    "run_tpf",
    "simulate",
    "simulate_run",
    "speculative_tpf_uniform",
    "survival",
    "tokens_per_second",
    "tpf",
    "uniform_weights",
    "wall_clock_speedup",
]
