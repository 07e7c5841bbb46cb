"""CUDA-graph replay of the corrector head for fixed batch-size buckets.

A verify round's head call is a few parallel projections and one fused launch; at small
batches the launch overheads dominate, so :class:`CorrectorGraphs` captures
:meth:`Corrector.select` once per (batch bucket, temperature) on static input buffers and
replays it: a call copies its B rows into the smallest bucket ≥ B (the padding rows hold
valid ids and zeros, and their outputs are dropped) and returns the first B rows. Capture
needs CUDA tensors; the folded tables are computed before the first capture so that nothing
inside a graph allocates them.

The graphs take the head as what it offers (:class:`Head`), not as the module class above this
package: kernels never import the module layer. Its input, :class:`CorrectorInputs`, lives in
this package so that the static buffers can be one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from brisk.runtime.kernels.corrector_step import CorrectorInputs, need_uniforms

if TYPE_CHECKING:
    from brisk.runtime.backbone import Backbone

__all__ = ["DEFAULT_BUCKETS", "CorrectorGraphs", "Head"]

DEFAULT_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


class Head(Protocol):
    """What the graphs need of a corrector head (:class:`brisk.runtime.corrector.Corrector`):
    its sizes, its weights' device and dtype (``w_c``), the folded tables and ``select``, whose
    result is a dataclass of ``[B, …]`` tensors."""

    config: Any
    w_c: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def tables(self, backbone: Backbone) -> tuple[Tensor, Tensor]: ...

    def select(
        self, backbone: Backbone, inputs: CorrectorInputs, temperature: float, impl: str
    ) -> Any: ...


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: CorrectorInputs  # static [bucket, …] buffers
    output: Any  # the head's selection, a dataclass of static [bucket, …] tensors
    tables: tuple[Tensor, Tensor]  # the folded tables the graph reads (kept alive here)


class CorrectorGraphs:
    """``select`` with :meth:`Corrector.select`'s signature, replayed from CUDA graphs.

    Graphs are captured lazily on first use of a (bucket, temperature) pair, or all at once
    with :meth:`capture`. ``impl`` is the head's implementation inside the graph (the fused
    kernel by default), fixed when the graphs are built: ``select`` takes no ``impl`` of its
    own. Batches larger than the largest bucket run eagerly, with the same ``impl``.
    """

    def __init__(
        self,
        head: Head,
        backbone: Backbone,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        impl: str = "triton",
        device: torch.device | str | None = None,
    ) -> None:
        device = torch.device(device) if device is not None else head.w_c.weight.device
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"device: CUDA graphs need a CUDA device, the head is on {device}")
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"buckets: need batch sizes ≥ 1, got {list(buckets)!r}")
        self.head, self.backbone, self.impl, self.device = head, backbone, impl, device
        self.buckets = tuple(sorted(set(buckets)))
        self.config = head.config
        self._graphs: dict[tuple[int, float], _Captured] = {}
        self._pool: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # teacher-forced forward: eager
        return self.head(*args, **kwargs)

    def bucket(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    def capture(self, temperatures: Sequence[float] = (0.0,)) -> None:
        for T in temperatures:
            for b in self.buckets:
                self._graph(b, T)

    def _graph(self, bucket: int, temperature: float) -> _Captured:
        tables = self.head.tables(self.backbone)  # outside the graph; cached unless weights moved
        key = (bucket, float(temperature))
        captured = self._graphs.get(key)
        if captured is not None and captured.tables[0] is tables[0]:
            return captured
        if captured is not None:  # the head's weights changed: every graph read the old tables
            self._graphs.clear()
        H, dev = self.head.config.hidden_size, self.device
        dtype = self.head.w_c.weight.dtype
        with torch.inference_mode(False):  # static buffers callers may fill in any mode
            inputs = self._buffers(bucket, H, dtype, dev)

        static = inputs if temperature > 0 else dataclasses.replace(inputs, u=None)

        def run() -> Any:
            return self.head.select(self.backbone, static, temperature, impl=self.impl)

        stream = torch.cuda.Stream(device=dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):  # warm-up: compile the kernel, settle the allocator
            for _ in range(2):
                run()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = run()
        self._pool = graph.pool()
        self._graphs[key] = captured = _Captured(graph, inputs, output, tables)
        return captured

    def _buffers(
        self, bucket: int, H: int, dtype: torch.dtype, dev: torch.device
    ) -> CorrectorInputs:
        c = self.head.config
        return CorrectorInputs(
            anchor_hidden=torch.zeros(bucket, H, dtype=dtype, device=dev),
            anchor_ids=torch.zeros(bucket, dtype=torch.long, device=dev),
            mask_hidden=torch.zeros(bucket, c.M, H, dtype=dtype, device=dev),
            cand_logits=torch.zeros(bucket, c.M, c.K, dtype=dtype, device=dev),
            cand_ids=torch.arange(c.K, device=dev).expand(bucket, c.M, c.K).contiguous(),
            u=torch.full((bucket, c.M), 0.5, dtype=torch.float32, device=dev),
        )

    @torch.no_grad()
    def select(self, backbone: Backbone, inputs: CorrectorInputs, temperature: float = 0.0) -> Any:
        """:meth:`Corrector.select` by graph replay (same result; ``impl`` is the graphs')."""
        if backbone is not self.backbone:
            raise ValueError("backbone: the graphs were captured for another backbone")
        B = inputs.anchor_ids.shape[0]
        bucket = self.bucket(B)
        if bucket is None:  # beyond the largest bucket: eager
            return self.head.select(backbone, inputs, temperature, impl=self.impl)
        need_uniforms(temperature, inputs.u)
        cap = self._graph(bucket, temperature)
        static = cap.inputs.tensors()
        for name, value in inputs.tensors().items():  # copy_ would broadcast a wrong shape
            if value.shape != (B, *static[name].shape[1:]):
                raise ValueError(
                    f"{name}: expected {[B, *static[name].shape[1:]]}, got {list(value.shape)}"
                )
            static[name][:B].copy_(value)
        cap.graph.replay()
        out = cap.output  # the static buffers: the next replay overwrites them
        rows = {f.name: getattr(out, f.name)[:B].clone() for f in dataclasses.fields(out)}
        return dataclasses.replace(out, **rows)
