"""Introspective strided decoding (I-DLM's ISD) with optional corrector, exact end to end.

- :mod:`~brisk.runtime.isd.batched` — the batched, tensor-only step (state + pure functions) that
  brisk's loop, SGLang and CUDA graphs call;
- :mod:`~brisk.runtime.isd.loop` — :func:`decode`: brisk's loop around the step (KV cache,
  prefill, logs);
- :mod:`~brisk.runtime.isd.reference` — the readable single-request loop the step is tested
  against.
"""

from brisk.runtime.isd.batched import Draft, ISDState, StepContext, StepResult, init_state, step
from brisk.runtime.isd.loop import KVSlots, decode
from brisk.runtime.isd.options import ISDOptions
from brisk.runtime.isd.reference import reference_decode
from brisk.runtime.isd.result import DecodeResult, RequestOutput

__all__ = [
    "DecodeResult",
    "Draft",
    "ISDOptions",
    "ISDState",
    "KVSlots",
    "RequestOutput",
    "StepContext",
    "StepResult",
    "decode",
    "init_state",
    "reference_decode",
    "step",
]
