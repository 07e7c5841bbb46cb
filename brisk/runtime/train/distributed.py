"""Data-parallel training under ``torchrun``: DDP replicas or FSDP2 shards, mixed precision,
activation checkpointing, gradient accumulation and distributed checkpoints.

Nothing here is home-made distribution: the process group is torch.distributed's, sharding is
``torch.distributed.fsdp.fully_shard`` (FSDP2) and sharded checkpoints are
``torch.distributed.checkpoint`` (DCP). This module is the glue a training loop needs around
them:

- :class:`Dist`, the rank, world size and the rank's device (``Dist.device``: ``cuda:LOCAL_RANK``
  where CUDA exists, else the CPU) with the three collectives a loop uses (sum, any, barrier), a
  no-op in one process;
- :func:`load_for_training`: the model a loop trains, loaded once (rank 0, on the host) and
  sharded onto every rank's device without a full copy on the others; it calls
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "Dist",
    "Precision",
    "autocast",
    "backend_for",
    "full_state_dict",
    "grad_sync",
    "load_for_training",
    "load_sharded",
    "micro_batches",
    "prepare",
    "save_sharded",
]

Precision = Literal["fp32", "bf16"]
SHARDED = "sharded"  # a checkpoint's DCP directory (model and optimizer shards)
T = TypeVar("T")
CPU = torch.device("cpu")


def backend_for(cuda: bool) -> str:
    """The process group's backend: ``"cpu:gloo,cuda:nccl"`` where CUDA exists, else ``"gloo"``.

    Why two backends rather than moving every collective onto the GPU: the loops reduce exact
    counters (token and acceptance counts, loss sums) as CPU float64 tensors, and
    ``torch.distributed``'s object collectives and DCP's metadata travel on the CPU too; nccl
    reduces only CUDA tensors. With one backend per device each collective runs where its
    tensors already are (CPU tensors on gloo, CUDA tensors on nccl), so a counter needs no
    device round trip and no caller has to remember which device a reduction wants.
    """
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"


@dataclass(frozen=True)
class Dist:
    """This process's rank in a world of ``world`` processes, and the device it computes on
    (``Dist()``: one process on the CPU)."""

    rank: int = 0
    world: int = 1
    device: torch.device = CPU

    @classmethod
    def from_env(cls, *, fsdp: bool = False) -> Dist:
        """The process group torchrun describes (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``),
        initialised here if it is not yet; one process without it. FSDP needs a process group
        even for one rank: ``fsdp`` without torchrun is an error naming the option.

        The device is ``cuda:LOCAL_RANK`` where CUDA exists, else the CPU. It is made the
        current CUDA device and given to ``init_process_group`` (``device_id``) *before* the
        group starts: nccl binds each rank's communicator to the current device, and without
        it every rank's FSDP shards and collectives land on ``cuda:0``. The backend is
        :func:`backend_for`'s."""
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if fsdp and not world:
            raise ValueError(
                "--fsdp: needs a process group; run under torchrun "
                "(torchrun --nproc-per-node P -m brisk.cli ...)"
            )
        cuda = torch.cuda.is_available()
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local) if cuda else CPU
        if world <= 1 and not fsdp:
            return cls(device=device)
        import torch.distributed as dist

        if not dist.is_initialized():
            if cuda:
                torch.cuda.set_device(device)
            dist.init_process_group(backend_for(cuda), device_id=device if cuda else None)
            # torch asks for an explicit destroy: a gloo group torn down with the interpreter
            # can abort the process at exit ("terminate called without an active exception")
            atexit.register(_destroy_process_group)
        return cls(dist.get_rank(), dist.get_world_size(), device)

    @property
    def group(self) -> bool:
        """Whether a process group is up (FSDP with one rank has one too)."""
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def sum(self, values: Tensor) -> Tensor:
        """All-reduced sum (a no-op in a single process), on the device ``values`` sit on: the
        backend of :func:`backend_for` serves CPU and CUDA tensors alike."""
        if self.world > 1:
            import torch.distributed as dist

            values = values.clone()
            dist.all_reduce(values)
        return values

    def any(self, flag: bool, device: torch.device | None = None) -> bool:
        """Whether ``flag`` holds on some rank: one all-reduce of a one-element tensor on
        ``device`` (default :attr:`device`)."""
        if self.world == 1:
            return flag
        on = self.device if device is None else device
        return bool(self.sum(torch.tensor([float(flag)], device=on)).item() > 0)

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


def finish_group() -> None:
    """End a run that finished on every rank: a barrier, so no rank tears its gloo pairs down
    while a peer still writes the last checkpoint (without it, 1 two-rank FSDP run in 20 aborted
    at exit: "terminate called without an active exception"), then the objects that hold the
    group (FSDP modules, optimizers, the run's locals, gone once the loop returned) collected
    while the interpreter is whole, then the group destroyed. A no-op without a group. Only
    after success: a rank that failed exits at once (the ``atexit`` destroy, no barrier) and
    torchrun stops the others, where a barrier would wait for a peer stuck in a collective."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()


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


def load_for_training(
    load: Callable[[], PreTrainedModel],
    dist: Dist,
    *,
    fsdp: bool,
    precision: Precision,
    checkpointing: bool,
    device: torch.device | None = None,
) -> tuple[PreTrainedModel, Any]:
    """``(model, net)``: the model a training loop optimizes, on ``device`` (default
    ``dist.device``), and the module its step calls (:func:`prepare`'s).

    Without ``fsdp`` every rank runs ``load`` (DDP keeps a whole replica per rank anyway). Under
    FSDP only rank 0 runs it, on the host; no other rank ever holds the full fp32 model:

    1. rank 0 keeps the full state dict (its CPU tensors) and sends the others the model's
       class, config and dtype and its non-persistent buffers (rotary ``inv_freq`` and the
       like, which a state dict leaves out; small);
    2. the other ranks build the same architecture on the ``meta`` device (no storage), and
       rank 0 moves its own model there (its state dict keeps the weights alive);
    3. every rank shards (:func:`prepare`), allocates its shards on ``device``
       (``to_empty``), and ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each
       tensor from rank 0, every rank keeping its shard;
    4. the non-persistent buffers are copied in (``to_empty`` left them uninitialised).

    A rank's host peak is then its shards plus one full tensor in flight, not the model.
    ``load`` returns the model in its training dtype on the CPU (e.g.
    ``lambda: load_causal_lm(path, False, torch.float32)``), with anything the run changes
    (a MASK token added, resumed weights) already applied: the others copy rank 0's config.
    """
    device = dist.device if device is None else device
    if not fsdp:
        model = load().to(device)
        net = prepare(model, dist, fsdp=False, precision=precision, checkpointing=checkpointing)
        return model, net
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full: dict[str, Tensor] = {}
    skeleton: list[Any] = [None]
    if dist.rank == 0:
        model = load()
        full = dict(model.state_dict())
        buffers = {n: b.detach() for n, b in model.named_buffers() if n not in full}
        dtype = next(model.parameters()).dtype
        skeleton = [(type(model), model.config, dtype, buffers)]
        _to_meta(model)
    tdist.broadcast_object_list(skeleton, src=0)
    cls, config, dtype, buffers = skeleton[0]
    if dist.rank != 0:
        with torch.device("meta"):
            model = cls._from_config(config, dtype=dtype)
    net = prepare(model, dist, fsdp=True, precision=precision, checkpointing=checkpointing)
    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)
    return model, net


def _to_meta(model: torch.nn.Module) -> None:
    """Move ``model``'s parameters and buffers to ``meta`` in place, keeping tied parameters
    tied: swapping tensors keeps every ``Parameter`` object (which several modules may share),
    where plain assignment would give each module a meta copy of its own."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device="meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


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
        raise ValueError(
            f"--resume: {path} holds no FSDP shards ({SHARDED}/): it was saved without --fsdp"
        )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(path / SHARDED))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
