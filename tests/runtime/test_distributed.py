"""The process group and the FSDP model load of :mod:`brisk.runtime.train.distributed`.

- On CUDA, :meth:`Dist.from_env` binds the rank to ``cuda:LOCAL_RANK`` before the group starts
  and starts one whose backends serve both devices the loops reduce on (CPU float64 counters,
  CUDA tensors): checked with ``init_process_group`` and ``set_device`` recorded (no GPU here).
- Every tensor a collective gets sits where the group's backend needs it: every c10d op of a
  two-rank FSDP base training run (gloo on this CPU) is recorded by a dispatch mode, and each
  tensor's device type must be one the live group's backend serves, and one the CUDA
  configuration's backend serves (which nccl alone does not: the counters are CPU float64).
- :func:`load_for_training` under two FSDP ranks: the sharded model's full state dict and
  non-persistent buffers are exactly the plain load's, its logits equal it (observed: bit
  equal; bound 1e-6), rank 1 never runs the load, and its resident peak during the load grows
  by less than three quarters of the fp32 model (its half plus one tensor in flight; observed
  0.59) where the plain path's grows by more than 0.9 of it (observed 1.06: the negative
  control, run beside it, that shows the measurement sees a full copy).

Run as a script (``torchrun ... test_distributed.py MODE OUT``) this file is the worker of the
two-rank tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from brisk.runtime.train import distributed
from brisk.runtime.train.distributed import Dist, backend_for, load_for_training, prepare

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# two ranks take a GPU each; with fewer GPUs they run on the CPU (gloo)
GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
BASE_TOML = """
steps = 3
batch_size = 16
warmup_steps = 1
strides = [2, 4]
log_every = 1
final_eval_problems = 0
eval_problems = 0
save_every = 0
[task]
max_operands = 2
max_digits = 1
ops = "+"
style_weights = [1.0, 0.0, 0.0, 0.0]
reference_weights = [1.0, 0.0, 0.0, 0.0]
verb_weights = [1.0, 0.0, 0.0]
[model]
hidden_size = 64
layers = 2
intermediate_size = 128
max_positions = 128
"""


def served(backend: str) -> set[str]:
    """The device types a backend string serves: ``"cpu:gloo,cuda:nccl"`` → {cpu, cuda};
    one backend alone serves what torch registers for it (nccl: cuda; gloo: cpu and cuda)."""
    if ":" in backend:
        return {pair.split(":")[0] for pair in backend.split(",")}
    return {"nccl": {"cuda"}, "gloo": {"cpu", "cuda"}}[backend]


def test_from_env_on_cuda_binds_the_rank_before_a_group_serving_cpu_and_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 3 of 8 under torchrun on a CUDA machine: ``set_device(cuda:3)`` comes before
    ``init_process_group``, which gets ``device_id=cuda:3`` and a backend serving CPU (the
    float64 counters ``Dist.sum`` reduces) and CUDA; ``Dist.device`` is ``cuda:3``."""
    import torch.distributed as dist

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)

    def init(backend: str, **kwargs: Any) -> None:
        calls.append(("init", backend, kwargs.get("device_id")))

    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 8)
    monkeypatch.setattr(distributed.atexit, "register", lambda f: f)

    d = Dist.from_env(fsdp=True)
    cuda3 = torch.device("cuda", 3)
    assert [c[0] for c in calls] == ["set_device", "init"]
    assert torch.device(calls[0][1]) == cuda3
    assert calls[1][2] is not None
    assert torch.device(calls[1][2]) == cuda3
    assert served(calls[1][1]) == {"cpu", "cuda"}
    assert calls[1][1] == backend_for(cuda=True) == "cpu:gloo,cuda:nccl"
    assert (d.rank, d.world, d.device) == (3, 8, cuda3)


def test_one_process_needs_no_group_and_names_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no process group in one process")

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(dist, "init_process_group", refuse)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Dist.from_env() == Dist(0, 1, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert Dist.from_env().device == torch.device("cuda", 0)
    assert Dist().any(True)
    assert not Dist().any(False)
    values = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert torch.equal(Dist().sum(values), values)
    assert served(backend_for(cuda=False)) == {"cpu", "cuda"}
    assert served("nccl") == {"cuda"}  # what today's CUDA group served: no CPU counters


# --- two ranks under torchrun ---------------------------------------------------------------


def torchrun(mode: str, out: Path, *args: str, gpus: bool = False) -> list[dict[str, Any]]:
    """Run this file's worker on two ranks (on two GPUs with ``gpus``, else on the CPU); each
    rank's JSON record."""
    out.mkdir(parents=True, exist_ok=True)
    run = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd = [sys.executable, *run, __file__, mode, str(out), *args]
    env = ENV if gpus else {**ENV, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_every_collective_of_fsdp_training_gets_tensors_its_backend_serves(
    tmp_path: Path,
) -> None:
    """Three steps of FSDP base training (two micro-batches per rank, the final save), with
    ``Dist.any`` and a float64 ``Dist.sum`` after: every c10d op's tensors sit on a device
    type the live group serves and the CUDA configuration serves; the float64 counters are
    among them (an all-reduce of a CPU float64 tensor), and so are FSDP's all-gathers and
    reduce-scatters. With two GPUs the ranks run on them (nccl and gloo), else on the CPU."""
    config = tmp_path / "base.toml"
    config.write_text(BASE_TOML)
    args = (str(config), str(tmp_path / "run"))
    for rec in torchrun("collectives", tmp_path / "ranks", *args, gpus=GPUS):
        ops = rec["ops"]
        assert len(ops) > 100
        for op, devices, _ in ops:
            assert set(devices) <= served(rec["backend"]), (op, devices, rec["backend"])
            assert set(devices) <= served(backend_for(cuda=True)), (op, devices)
        names = {op for op, _, _ in ops}
        assert any("all_gather" in n or "allgather" in n for n in names), names
        assert any("reduce_scatter" in n for n in names), names
        counters = [n for n, devices, dtypes in ops if "float64" in dtypes and devices == ["cpu"]]
        assert any("allreduce" in n for n in counters), names
        assert rec["any"] == [True, False]
        assert rec["sum"] == [2.0, 4.0]


def tiny_config(layers: int, hidden: int, intermediate: int, vocab: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    )


# 32 layers, hidden 512: ≈ 105 M parameters, 420 MB in fp32; its largest tensor (the tied
# embedding) 17 MB
LARGE = (32, 512, 1536, 8192)


@pytest.mark.slow
def test_fsdp_load_shards_rank_zeros_weights_without_a_full_copy_elsewhere(
    tmp_path: Path,
) -> None:
    by_mode = {m: torchrun(m, tmp_path / m) for m in ("meta", "plain")}
    size = by_mode["meta"][0]["model_bytes"]
    assert size > 400e6
    meta, plain = by_mode["meta"], by_mode["plain"]
    assert [r["loaded"] for r in meta] == [True, False]  # rank 1 never ran the load
    assert [r["loaded"] for r in plain] == [True, True]
    for rec in meta:
        assert rec["logits_max_err"] <= 1e-6, rec
        rotary = ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]
        assert rec["buffers_equal"] == rotary
        assert rec["tied"]
    assert meta[0]["state_dict_equal"]  # gathered on rank 0: every tensor bit-equal
    # rank 1's resident peak during the load: its shards and one tensor in flight, where the
    # plain path holds the whole model
    assert meta[1]["peak_growth"] < 0.75 * size, (meta[1]["peak_growth"], size)
    assert plain[1]["peak_growth"] > 0.9 * size, (plain[1]["peak_growth"], size)


# --- the worker -----------------------------------------------------------------------------


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) * 1024


def _record_collectives(out: Path, config: str, run_dir: str) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from brisk.cli import main

    class Collectives(TorchDispatchMode):
        """Every c10d op (eager and functional) with its tensors' device types and dtypes."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, list[str], list[str]]] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func.namespace in ("c10d", "_c10d_functional"):
                tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                devices = sorted({t.device.type for t in tensors})
                dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in tensors})
                self.ops.append((str(func), devices, dtypes))
            return func(*args, **(kwargs or {}))

    with Collectives() as seen:
        train = ["train", "base", "--config", config, "--no-progress", "--threads", "1"]
        assert main([*train, "--out", run_dir, "--fsdp", "--micro-batch-size", "4"]) == 0
        d = Dist.from_env(fsdp=True)
        flags = [d.any(d.rank == 1), d.any(False)]
        total = d.sum(torch.tensor([1.0, 2.0], dtype=torch.float64))
    backend = dist.get_backend_config()
    return {"backend": backend, "ops": seen.ops, "any": flags, "sum": total.tolist()}


def _load(out: Path, mode: str) -> dict[str, Any]:
    from transformers import Qwen3ForCausalLM

    d = Dist.from_env(fsdp=True)
    config = tiny_config(*LARGE)
    loaded = []

    def load() -> Any:
        loaded.append(d.rank)
        torch.manual_seed(0)
        return Qwen3ForCausalLM(config).float()

    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the resident peak restarts from here
    if mode == "meta":
        model, net = load_for_training(load, d, fsdp=True, precision="fp32", checkpointing=True)
    else:  # what the loops did before: every rank loads the whole model, then shards it
        model = load()
        net = prepare(model, d, fsdp=True, precision="fp32", checkpointing=True)
    growth = _status("VmHWM") - before
    d.barrier()

    ref = load()
    loaded.pop()
    model.eval()
    ids = torch.randint(0, config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        err = (net(input_ids=ids).logits - ref(input_ids=ids).logits).abs().max()
    own = dict(ref.named_buffers())
    full = distributed.full_state_dict(model, True)  # rank 0's; None elsewhere
    sd = ref.state_dict()
    same = full is not None and full.keys() == sd.keys()
    return {
        "loaded": bool(loaded),
        "peak_growth": growth,
        "model_bytes": sum(p.numel() * p.element_size() for p in ref.parameters()),
        "logits_max_err": float(err),
        "buffers_equal": sorted(n for n, b in model.named_buffers() if torch.equal(b, own[n])),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "state_dict_equal": same and all(torch.equal(full[k], sd[k]) for k in sd),
    }


def _worker(mode: str, out: Path, *args: str) -> None:
    from brisk.runtime.train.distributed import finish_group

    rank = int(os.environ["RANK"])
    record = _record_collectives(out, *args) if mode == "collectives" else _load(out, mode)
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    # the program's shutdown (what brisk's CLI does), while the interpreter is whole: no rank
    # tears its gloo pairs down while the other still talks, and the objects holding the group
    # are collected before it is destroyed (a barrier and a destroy without the collection
    # still aborted, rarely, with "terminate called without an active exception")
    finish_group()


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
