"""Sequential candidate selection of the corrector (naive reference; Triton twin to come)."""

from brisk.runtime.kernels.corrector_step.naive import (
    N_FEATURES,
    SelectOutput,
    StepWeights,
    confidence_features,
    corrector_select,
)

__all__ = ["N_FEATURES", "SelectOutput", "StepWeights", "confidence_features", "corrector_select"]
