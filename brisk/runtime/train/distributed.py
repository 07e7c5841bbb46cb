"""Data-parallel training under ``torchrun``: DDP replicas or FSDP2 shards, mixed precision,
activation checkpointing, gradient accumulation and distributed checkpoints.

Nothing here is home-made distribution: the process group is torch.distributed's (gloo on CPU,
nccl on GPU), sharding is ``torch.distributed.fsdp.fully_shard`` (FSDP2) and sharded
checkpoints are ``torch.distributed.checkpoint`` (DCP). This module is the glue a training loop
needs around them:

- :class:`Dist`, the rank and world size with the three collectives a loop uses (sum, any,
  barrier), a no-op in one process;
- :func:`prepare`: activation checkpointing per decoder layer, then FSDP2 (each decoder layer a
  unit, the root holding embeddings and head) or DDP;
- :func:`micro_batches` and :func:`grad_sync`: gradient accumulation, so that the *global* batch
  (``batch_size``) is independent of the number of ranks and of how many rows fit in memory;
- :func:`save_sharded` / :func:`load_sharded` and :func:`full_state_dict`: a checkpoint's
  sharded model and optimizer state (resharded on load: a run may resume on another world
  size) and the plain weights every other command reads.

Precision: ``bf16`` computes in bfloat16 and keeps fp32 master weights, optimizer state and
gradient reductions. Under FSDP2 that is its ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``; in one process or under DDP it is ``torch.autocast``. Losses are always
taken in fp32 (the training loops cast logits before the cross-entropy).
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor

__all__ = [
    "Dist",
    "Precision",
    "autocast",
    "full_state_dict",
    "grad_sync",
    "load_sharded",
    "micro_batches",
    "prepare",
    "save_sharded",
]

Precision = Literal["fp32", "bf16"]
SHARDED = "sharded"  # a checkpoint's DCP directory (model and optimizer shards)
T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """This process's rank in a world of ``world`` processes (``Dist()``: one process)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls, *, fsdp: bool = False) -> Dist:
        """The process group torchrun describes (``WORLD_SIZE``, ``RANK``, ...), initialised
        here if it is not yet; one process without it. FSDP needs a process group even for one
        rank: ``fsdp`` without torchrun is an error naming the option."""
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if fsdp and not world:
            raise ValueError(
                "--fsdp: needs a process group; run under torchrun "
                "(torchrun --nproc-per-node P -m brisk.cli ...)"
            )
        if world <= 1 and not fsdp:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            # torch asks for an explicit destroy: a gloo group torn down with the interpreter
            # can abort the process at exit ("terminate called without an active exception")
            atexit.register(_destroy_process_group)
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def group(self) -> bool:
        """Whether a process group is up (FSDP with one rank has one too)."""
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def sum(self, values: Tensor) -> Tensor:
        """All-reduced sum (a no-op in a single process)."""
        if self.world > 1:
            import torch.distributed as dist

            values = values.clone()
            dist.all_reduce(values)
        return values

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` holds on some rank: one all-reduce, on ``device`` (nccl needs the
        GPU)."""
        if self.world == 1:
            return flag
        return bool(self.sum(torch.tensor([float(flag)], device=device)).item() > 0)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def rows(self, batch_size: int) -> slice:
        """This rank's rows ``rank::world`` of a global batch; the world size must divide it."""
        if batch_size % self.world:
            raise ValueError(
                f"--batch-size: the global batch {batch_size} is not divisible by the world "
                f"size {self.world}"
            )
        return slice(self.rank, None, self.world)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def micro_batches(rows: Sequence[T], micro_batch_size: int) -> list[Sequence[T]]:
    """``rows`` in consecutive chunks of ``micro_batch_size`` (0: one chunk of all of them)."""
    if micro_batch_size <= 0 or micro_batch_size >= len(rows):
        return [rows]
    return [rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"model: {type(model).__name__} has no model.layers to shard")
    return list(layers)


def prepare(
    model: Any, dist: Dist, *, fsdp: bool, precision: Precision, checkpointing: bool
) -> Any:
    """The module a training step calls: ``model`` with activation checkpointing per decoder
    layer (transformers' own, non-reentrant), sharded with FSDP2 (each decoder layer, then the
    root; bf16 compute with fp32 reductions under ``precision = "bf16"``) or wrapped in DDP
    when ``dist`` has several ranks, else ``model`` itself. FSDP2 shards in place: the returned
    module *is* ``model`` (parameters become DTensors), so build the optimizer afterwards."""
    if checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    if fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if precision == "bf16" else None,
            reduce_dtype=torch.float32,
        )
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    if dist.world > 1:
        return torch.nn.parallel.DistributedDataParallel(model)
    return model


def autocast(precision: Precision, fsdp: bool, device: torch.device) -> Any:
    """The compute-precision context of a forward: FSDP2 casts by its policy, everything else
    autocasts to bf16 under ``precision = "bf16"``."""
    if precision == "bf16" and not fsdp:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


@contextmanager
def grad_sync(net: Any, last: bool) -> Iterator[None]:
    """Gradient accumulation: reduce gradients across ranks only on the ``last`` micro-batch of
    a step (FSDP2 ``set_requires_gradient_sync``, DDP ``no_sync``); the gradients summed over
    the micro-batches are the same either way."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(net, FSDPModule):
        net.set_requires_gradient_sync(last)
        yield
        return
    if isinstance(net, torch.nn.parallel.DistributedDataParallel) and not last:
        with net.no_sync():
            yield
        return
    yield


def full_state_dict(model: Any, fsdp: bool) -> dict[str, Tensor] | None:
    """The plain (unsharded, CPU) weights for ``save_pretrained``: a collective under FSDP (every
    rank calls it; rank 0 gets the dict, the others ``None``), the module's own state dict
    otherwise."""
    if not fsdp:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=options)
    import torch.distributed as dist

    return sd if dist.get_rank() == 0 else None


def save_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer shards of every rank into ``path/sharded`` (DCP; a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path / SHARDED))


def load_sharded(path: Path, model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Load :func:`save_sharded`'s state into the sharded ``model`` and ``optimizer`` (DCP
    reshards: the world size may differ from the one that saved it). A checkpoint without shards
    (written by a run without FSDP) is an error naming it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (path / SHARDED).is_dir():
        raise ValueError(f"--resume: {path} holds no FSDP shards ({SHARDED}/): it was saved "
                         "without --fsdp")  # fmt: skip
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path / SHARDED))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])  # fmt: skip
