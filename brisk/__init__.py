"""brisk — BRISK-DLM verified parallel decoding for diffusion language models.

Layers: :mod:`brisk.theory` (renewal-reward TPF, progress weights, acceptance profiles),
:mod:`brisk.mechanism` (block logs and same-state replay diagnostics) and
:mod:`brisk.runtime` (verification, ISD decoding, the corrector, training and serving).
"""

__version__ = "0.1.0"
