"""Introspective strided decoding (I-DLM's ISD) with optional corrector, exact end to end.

- :mod:`~brisk.runtime.isd.batched` — the batched, tensor-only step: a pure transition from a
  state and a forward's logits to the next state and each row's committed tokens, which brisk's
  loop, the SGLang worker and CUDA graphs call, on the rows of
  :mod:`~brisk.runtime.isd.state` (the draft, the state, the step's context and result);
- :mod:`~brisk.runtime.isd.outputs` — what brisk's loop keeps per request around it: output,
  EOS / budget stop, round statistics;
- :mod:`~brisk.runtime.isd.loop` — :func:`decode`: brisk's loop around the step (KV cache,
  prefill); :mod:`~brisk.runtime.isd.blocklog` its block logs;
- :mod:`~brisk.runtime.isd.reference` — the independent single-request twin (its own proposal,
  verification and correction) the step is tested against.
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
