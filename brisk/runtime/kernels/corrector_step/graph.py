"""CUDA-graph replay of the corrector head for fixed batch-size buckets.

A verify round's head call is a few parallel projections and one fused launch; at small
batches the launch overheads dominate, so :class:`CorrectorGraphs` captures
:meth:`Corrector.select` once per (batch bucket, temperature) on static input buffers and
replays it: a call copies its B rows into the smallest bucket ≥ B (the padding rows hold
valid ids and zeros, and their outputs are dropped) and returns the first B rows. Capture
needs CUDA tensors; the folded tables are computed before the first capture so that nothing
inside a graph allocates them.

The graphs take the head as what it offers (:class:`Head`), not as the module class above this
package: kernels never import the module layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from brisk.runtime.kernels.corrector_step import need_uniforms

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

    def select(self, backbone: Backbone, *args: Any, **kwargs: Any) -> Any: ...


@dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: dict[str, Tensor]
    output: Any  # the head's selection, a dataclass of static [bucket, …] tensors
    tables: tuple[Tensor, Tensor]  # the folded tables the graph reads (kept alive here)


class CorrectorGraphs:
    """``select`` with :meth:`Corrector.select`'s signature, replayed from CUDA graphs.

    Graphs are captured lazily on first use of a (bucket, temperature) pair, or all at once
    with :meth:`capture`. ``impl`` is the head's implementation inside the graph (the fused
    kernel by default). Batches larger than the largest bucket run eagerly.
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

        def run() -> Any:
            return self.head.select(
                self.backbone,
                inputs["anchor_hidden"],
                inputs["anchor_ids"],
                inputs["mask_hidden"],
                inputs["cand_logits"],
                inputs["cand_ids"],
                temperature,
                u=inputs["u"] if temperature > 0 else None,
                impl=self.impl,
            )

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
    ) -> dict[str, Tensor]:
        c = self.head.config
        return {
            "anchor_hidden": torch.zeros(bucket, H, dtype=dtype, device=dev),
            "anchor_ids": torch.zeros(bucket, dtype=torch.long, device=dev),
            "mask_hidden": torch.zeros(bucket, c.M, H, dtype=dtype, device=dev),
            "cand_logits": torch.zeros(bucket, c.M, c.K, dtype=dtype, device=dev),
            "cand_ids": torch.arange(c.K, device=dev).expand(bucket, c.M, c.K).contiguous(),
            "u": torch.full((bucket, c.M), 0.5, dtype=torch.float32, device=dev),
        }

    @torch.no_grad()
    def select(
        self,
        backbone: Backbone,
        anchor_hidden: Tensor,
        anchor_ids: Tensor,
        mask_hidden: Tensor,
        cand_logits: Tensor,
        cand_ids: Tensor,
        temperature: float = 0.0,
        u: Tensor | None = None,
        impl: str | None = None,
    ) -> Any:
        """:meth:`Corrector.select` by graph replay (same arguments and result)."""
        if backbone is not self.backbone:
            raise ValueError("backbone: the graphs were captured for another backbone")
        B = anchor_ids.shape[0]
        bucket = self.bucket(B)
        if bucket is None:  # beyond the largest bucket: eager
            return self.head.select(
                backbone,
                anchor_hidden,
                anchor_ids,
                mask_hidden,
                cand_logits,
                cand_ids,
                temperature,
                u,
                impl=impl or self.impl,
            )
        need_uniforms(temperature, u)
        if impl is not None and impl != self.impl:
            raise ValueError(f"impl: the graphs were captured with {self.impl!r}, not {impl!r}")
        cap = self._graph(bucket, temperature)
        given = {
            "anchor_hidden": anchor_hidden,
            "anchor_ids": anchor_ids,
            "mask_hidden": mask_hidden,
            "cand_logits": cand_logits,
            "cand_ids": cand_ids,
        }
        if u is not None:
            given["u"] = u
        for name, value in given.items():  # copy_ would broadcast a wrong shape: refuse it
            if value.shape != (B, *cap.inputs[name].shape[1:]):
                raise ValueError(
                    f"{name}: expected {[B, *cap.inputs[name].shape[1:]]}, got {list(value.shape)}"
                )
            cap.inputs[name][:B].copy_(value)
        cap.graph.replay()
        out = cap.output  # the static buffers: the next replay overwrites them
        rows = {f.name: getattr(out, f.name)[:B].clone() for f in dataclasses.fields(out)}
        return dataclasses.replace(out, **rows)
