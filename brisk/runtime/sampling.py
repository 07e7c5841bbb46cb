"""Stateless randomness and the one inverse-CDF sampler every draw in the runtime goes through.

A uniform is a pure function of ``(seed, request, counter, slot)``: the request's seed, its id,
the request's own forward counter and a slot that names the decision within that forward
(:class:`Slots`). Nothing depends on the batch a request shares or on the device, so a request
decodes to the same tokens alone, in any batch and on CPU or GPU, and no uniform feeds two
decisions as long as each (counter, slot) names one decision.

The hash is a 32-bit counter-based mix (Wellons' ``lowbias32`` finalizer, chained over the four
words) computed with int64 tensor arithmetic that never overflows: products are split into 16-bit
halves. A uniform is ``(h + 0.5) / 2³²`` in float64, inside (0, 1) and never 0 or 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Slots", "counter_uniforms", "sample_inverse_cdf"]

_MASK32 = 0xFFFFFFFF
_MIX = (0x7FEB352D, 0x846CA68B)
_WORD_KEYS = (0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F)


class Slots:
    """Which uniform of a forward feeds which decision (M proposal positions).

    A verify round uses slot ``next`` for the correction or bonus draw, ``accept(i)`` for the
    acceptance draw of position i + 1 (i = 0..M−1) and ``draft(j)`` for the proposal of position
    j + 1 of the next block; a cold start uses ``next`` and ``draft(j)``. ``width`` uniforms per
    forward cover them all: ``[next, accept × M, draft × M]``.
    """

    def __init__(self, M: int) -> None:
        self.M = M

    def accept(self, i: int) -> int:
        return 1 + i

    @property
    def next(self) -> int:
        return 0

    def draft(self, j: int) -> int:
        return 1 + self.M + j

    @property
    def width(self) -> int:
        return 1 + 2 * self.M


def _mul32(x: Tensor, m: int) -> Tensor:
    """(x · m) mod 2³² for x in [0, 2³²) without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * m + (((hi * m) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX[0])
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX[1])
    return x ^ (x >> 16)


def _hash(words: tuple[Tensor, ...]) -> Tensor:
    h = torch.zeros((), dtype=torch.int64, device=words[0].device)
    for key, word in zip(_WORD_KEYS * 2, words, strict=False):
        h = _mix32(h ^ ((word + key) & _MASK32))
    return h


def counter_uniforms(seed: Tensor, request: Tensor, counter: Tensor, slots: int) -> Tensor:
    """Uniforms ``[B, slots]`` in (0, 1), float64, for rows with ``seed``, ``request`` and
    ``counter`` ``[B]`` (int64, any values; seeds and ids are hashed as two 32-bit words).

    >>> s = torch.tensor([0, 0, 1]); r = torch.tensor([3, 3, 3]); c = torch.tensor([5, 5, 5])
    >>> u = counter_uniforms(s, r, c, 4)
    >>> bool((u[0] == u[1]).all()), bool((u[0] == u[2]).any())
    (True, False)
    """
    seed, request, counter = (t.to(torch.int64)[:, None] for t in (seed, request, counter))
    slot = torch.arange(slots, dtype=torch.int64, device=seed.device)[None]
    words = (
        seed & _MASK32,
        (seed >> 32) & _MASK32,
        request & _MASK32,
        (request >> 32) & _MASK32,
        counter & _MASK32,
        slot.expand(seed.shape[0], slots),
    )
    h = _hash(words)
    return (h.to(torch.float64) + 0.5) / 2.0**32


def sample_inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw from unnormalized ``weights [..., V]`` with uniforms ``u [...]``.

    Returns the first index whose cumulative weight exceeds ``u · total``; a zero-weight index
    is never returned (rounding of ``u · total`` up to the total falls back to the last index
    with positive weight). This one sampler serves verification (corrections and bonus tokens),
    base drafts and the corrector.
    """
    cdf = weights.cumsum(-1)
    target = (u.to(cdf.dtype) * cdf[..., -1])[..., None]
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True)[..., 0]
    last_positive = (weights > 0).long().cumsum(-1).argmax(-1)
    return torch.minimum(idx, last_positive)
