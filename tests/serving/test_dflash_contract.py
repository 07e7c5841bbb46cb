"""A drafter brisk exports is a DFlash drafter to SGLang 0.5.23's own code, on this CPU, no server.

Two drafters of a tiny Qwen3 target (6 layers, H = 64, 4 heads, 2 KV heads, head_dim 16, rope
theta 1e6), 2 layers, block size 4, mask id 63, are saved with :func:`save_drafter`: one with
the default target layers ([1, 3]) and one with explicit ones ([0, 2, 4]: three features for two
layers). Their weights are random from a fixed seed, the RMSNorm weights too (all-ones norms
would hide a norm loaded into the wrong place). SGLang then reads them as its DFlash worker does:

- **config**: ``parse_dflash_draft_config`` (on ``get_config``'s HF config and on the raw
  ``config.json``) resolves brisk's block size, mask id, target layer ids and target depth;
  SGLang's registry maps ``architectures`` to its ``DFlashDraftModel``, whose layers are full,
  non-causal attention as brisk's are; SGLang's default target layers are brisk's over a grid of
  depths;
- **weights**: ``DFlashDraftModel(config, quant_config=None).load_weights`` takes brisk's
  ``model.safetensors``. SGLang skips names it does not know without a word, so every one of its
  parameters is compared with brisk's: ``qkv_proj`` rows = q | k | v, ``gate_up_proj`` rows =
  gate | up, the rest one to one, exactly;
- **numerics** of the pieces a CPU can drive without a ``ForwardBatch``, KV pool and attention
  backend (the full ``forward`` needs a ModelRunner): ``project_target_hidden`` against
  :meth:`~brisk.runtime.drafter.model.DFlashDrafter.project`, and every layer's context keys and
  values as the worker materialises them (``kv_proj_only``, ``apply_k_norm``, ``apply_k_rope`` at
  the tokens' positions, ``_append_target_hidden_sequential``) against
  :meth:`~brisk.runtime.drafter.model.DFlashDrafter.context_kv`, to 1e-5 in float32. On this
  CPU SGLang's RMSNorm and rotary dispatch to their plain-torch ``forward_native`` (the
  ``sgl_kernel`` stand-in has no AMX ops);
- **a negative control**: a checkpoint whose ``fc.weight`` is one feature too wide is refused by
  SGLang's loader ("DFLASH fc.weight shape mismatch") and by :func:`load_drafter`, in one line
  naming the key.

SGLang's side runs in a child process (this module run with ``-m``), since it changes
process-wide state: ``SGLANG_USE_CPU_ENGINE=1`` read at import, brisk's CPU stand-ins for
``sgl_kernel`` and ``torchvision`` first on ``PYTHONPATH`` (as a CPU server gets them,
:func:`~brisk.runtime.serving.cpu.activate`), and a world-1 gloo process group with SGLang's
model-parallel groups (``init_single_process_dist``), which its layers need even at TP = 1. The
child writes what SGLang read and computed to files; the tests compare them here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from brisk.runtime.drafter.model import (
    DFlashDrafter,
    drafter_config,
    load_drafter,
    save_drafter,
)
from brisk.runtime.drafter.model import (
    build_target_layer_ids as brisk_target_layer_ids,
)
from brisk.runtime.serving.cpu import activate

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 300
TOL = 1e-5
TARGET_LAYERS = 6
MASK_ID = 63
BLOCK_SIZE = 4
CASES: dict[str, list[int] | None] = {"default_ids": None, "explicit_ids": [0, 2, 4]}
EXPECTED_IDS = {"default_ids": [1, 3], "explicit_ids": [0, 2, 4]}
# two context rows: the first positions, and scattered ones up to max_position_embeddings − 1
POSITIONS = torch.tensor([[0, 1, 2, 3, 4], [7, 31, 64, 100, 127]])
FORMULA_GRID = [(L, n) for L in (4, 5, 6, 7, 12, 28, 36, 64) for n in range(1, 9)]
BAD = "bad_fc"  # the negative control's checkpoint: default_ids with fc one feature too wide


def target_config() -> Qwen3Config:
    return Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )


def random_drafter(target_layer_ids: list[int] | None, seed: int) -> DFlashDrafter:
    """A 2-layer drafter of :func:`target_config`, every weight random (norms around 1)."""
    config = drafter_config(
        target_config(),
        num_layers=2,
        block_size=BLOCK_SIZE,
        mask_token_id=MASK_ID,
        target_layer_ids=target_layer_ids,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        drafter = DFlashDrafter(config)
        with torch.no_grad():
            for p in drafter.parameters():
                if p.ndim == 1:
                    p.copy_(1 + 0.3 * torch.randn_like(p))
    return drafter.eval()


@dataclass(frozen=True)
class Contract:
    """What both sides read and computed: brisk's drafters and inputs, SGLang's report and
    tensors (per case: ``param.<name>``, ``project``, ``k.<layer>``, ``v.<layer>``)."""

    drafters: dict[str, DFlashDrafter]
    inputs: dict[str, torch.Tensor]
    report: dict[str, Any]
    sglang: dict[str, dict[str, torch.Tensor]]
    work: Path


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> Contract:
    work = tmp_path_factory.mktemp("dflash_contract")
    drafters, inputs = {}, {}
    for i, (name, ids) in enumerate(CASES.items()):
        drafters[name] = drafter = random_drafter(ids, seed=i)
        save_drafter(drafter, work / name)
        k = len(drafter.spec.target_layer_ids)
        gen = torch.Generator().manual_seed(10 + i)
        inputs[f"{name}.features"] = torch.randn(POSITIONS.numel(), k * 64, generator=gen)
    inputs["positions"] = POSITIONS.reshape(-1)
    save_file(inputs, str(work / "inputs.safetensors"))
    shutil.copytree(work / "default_ids", work / BAD)
    weights = load_file(str(work / BAD / "model.safetensors"))
    weights["fc.weight"] = torch.randn(64, 3 * 64, generator=gen)  # the config gives 2 features
    save_file(weights, str(work / BAD / "model.safetensors"))

    env = activate()
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    command = [sys.executable, "-m", "tests.serving.test_dflash_contract", str(work)]
    for _ in range(2):  # once more only if the process group's port was taken meanwhile
        child = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
        taken = any(m in child.stderr.lower() for m in ("address already in use", "eaddrinuse"))
        if child.returncode == 0 or not taken:
            break
    if child.returncode != 0:
        pytest.fail(f"SGLang's side failed (rc {child.returncode}):\n{child.stderr[-4000:]}")
    report = json.loads((work / "report.json").read_text())
    sglang = {name: load_file(str(work / f"{name}.sglang.safetensors")) for name in CASES}
    return Contract(drafters, inputs, report, sglang, work)


@pytest.mark.parametrize("case", CASES)
def test_sglang_parses_the_drafter_config(contract: Contract, case: str) -> None:
    """SGLang's parser resolves brisk's DFlash fields, from the HF config and from the JSON;
    its registry and its model take the drafter as brisk runs it."""
    spec = contract.drafters[case].spec
    report = contract.report[case]
    assert report["architecture"] == ["sglang.srt.models.dflash", "DFlashDraftModel"]
    assert report["config_class"] == "Qwen3Config"
    for source in ("get_config", "json"):
        parsed = report["parsed"][source]
        assert parsed["block_size"] == spec.block_size == BLOCK_SIZE, source
        assert parsed["mask_token_id"] == spec.mask_token_id == MASK_ID, source
        assert parsed["num_target_layers"] == spec.num_target_layers == TARGET_LAYERS, source
        assert parsed["num_hidden_layers"] == 2, source
        assert parsed["target_layer_ids"] == list(spec.target_layer_ids), source
        assert parsed["resolved_ids"] == list(spec.target_layer_ids) == EXPECTED_IDS[case]
    assert report["model_block_size"] == BLOCK_SIZE
    assert report["num_context_features"] == len(EXPECTED_IDS[case])
    # every layer as brisk's forward runs it: full attention, not causal (the block sees all of
    # its context and itself both ways), softmax scale 1/√d, no value scale
    assert report["attention"] == [[-1, "encoder_only", 16**-0.5, None]] * 2


def test_default_target_layers_agree_with_sglang(contract: Contract) -> None:
    """brisk's default ``target_layer_ids`` are SGLang's ``build_target_layer_ids``, ties
    (half to even) included, over a grid of target depths L and draft depths n."""
    for L, n in FORMULA_GRID:
        assert brisk_target_layer_ids(L, n) == contract.report["formula"][f"{L},{n}"], (L, n)


FUSED = {  # SGLang's fused parameter: brisk's (DFlash's) weights, stacked by rows in this order
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def expected_sglang_params(drafter: DFlashDrafter) -> dict[str, torch.Tensor]:
    """brisk's weights under SGLang's parameter names."""
    state = dict(drafter.state_dict())
    for i in range(len(drafter.layers)):
        for fused, parts in FUSED.items():
            rows = [state.pop(f"layers.{i}.{part}.weight") for part in parts]
            state[f"layers.{i}.{fused}.weight"] = torch.cat(rows)
    return state


@pytest.mark.parametrize("case", CASES)
def test_sglang_loads_every_weight_brisk_saved(contract: Contract, case: str) -> None:
    """Every parameter of SGLang's ``DFlashDraftModel`` holds brisk's weight, exactly."""
    expected = expected_sglang_params(contract.drafters[case])
    loaded = {
        k.removeprefix("param."): v
        for k, v in contract.sglang[case].items()
        if k.startswith("param.")
    }
    assert sorted(loaded) == sorted(expected)
    # q | k | v rows: (4 + 2 + 2) heads · 16
    assert loaded["layers.1.self_attn.qkv_proj.weight"].shape == (128, 64)
    for name, tensor in expected.items():
        assert loaded[name].dtype == torch.float32, name
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("case", CASES)
def test_projection_and_context_kv_match_sglang(contract: Contract, case: str) -> None:
    """SGLang's ``project_target_hidden`` and per-layer context K/V equal brisk's."""
    drafter = contract.drafters[case]
    ours = contract.sglang[case]
    # what ran: SGLang's plain-torch RMSNorm (hidden_norm, k_norm) and rotary
    assert contract.report[case]["dispatch"] == ["forward_native"] * 3
    B, C = POSITIONS.shape
    features = contract.inputs[f"{case}.features"]
    with torch.no_grad():
        context = drafter.project(features)
        torch.testing.assert_close(ours["project"], context, rtol=0, atol=TOL)
        kv = drafter.context_kv(context.view(B, C, -1), POSITIONS)
    assert len(kv) == 2
    for i, (k, v) in enumerate(kv):  # brisk: [B, kv_heads, C, d]; SGLang: [B·C, kv_heads, d]
        for got, want in ((ours[f"k.{i}"], k), (ours[f"v.{i}"], v)):
            want = want.transpose(1, 2).reshape(B * C, want.shape[1], want.shape[3])
            torch.testing.assert_close(got, want, rtol=0, atol=TOL)


def test_a_wrong_fc_width_is_refused_by_both(contract: Contract) -> None:
    """SGLang's loader refuses the too-wide ``fc.weight``; brisk names the key in one line."""
    assert "DFLASH fc.weight shape mismatch" in contract.report[BAD]
    with pytest.raises(ValueError, match=r"fc\.weight has shape \(64, 192\)") as err:
        load_drafter(contract.work / BAD)
    assert "\n" not in str(err.value)
    assert "(64, 128)" in str(err.value)


def sglang_side(work: Path) -> None:
    """The child: SGLang reads the checkpoints under ``work`` and writes what it got there."""
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.speculative.dflash_utils import (
        build_target_layer_ids,
        parse_dflash_draft_config,
    )
    from sglang.srt.utils.hf_transformers_utils import get_config
    from sglang.test.layer_ut_utils import init_single_process_dist

    from brisk.runtime.serving.process import free_port

    init_single_process_dist(master_port=free_port(), backend="gloo")
    torch.set_default_dtype(torch.float32)
    inputs = load_file(str(work / "inputs.safetensors"))
    positions = inputs["positions"]
    report: dict[str, Any] = {
        "formula": {f"{L},{n}": build_target_layer_ids(L, n) for L, n in FORMULA_GRID}
    }

    def model_of(path: Path) -> tuple[Any, DFlashDraftModel]:
        hf = get_config(str(path), trust_remote_code=False, revision=None, model_override_args={})
        return hf, DFlashDraftModel(config=hf, quant_config=None)

    for case in CASES:
        path = work / case
        hf, model = model_of(path)
        raw = json.loads((path / "config.json").read_text())
        parsed = {}
        for source, config in (("get_config", hf), ("json", raw)):
            cfg = parse_dflash_draft_config(draft_hf_config=config)
            parsed[source] = {
                "block_size": cfg.resolve_block_size(default=None),
                "mask_token_id": cfg.mask_token_id,
                "num_target_layers": cfg.num_target_layers,
                "num_hidden_layers": cfg.num_hidden_layers,
                "target_layer_ids": list(cfg.target_layer_ids or ()),
                "resolved_ids": cfg.resolve_target_layer_ids(
                    target_num_layers=TARGET_LAYERS, draft_num_layers=cfg.num_hidden_layers
                ),
            }
        cls, _ = ModelRegistry.resolve_model_cls(hf.architectures)
        model.load_weights(load_file(str(path / "model.safetensors")).items())
        out = {f"param.{k}": v.detach().clone() for k, v in model.named_parameters()}
        with torch.no_grad():
            context = model.project_target_hidden(inputs[f"{case}.features"])
            out["project"] = context
            for i, layer in enumerate(model.layers):  # DFlashWorkerV2's sequential path
                attn = layer.self_attn
                k, v = attn.kv_proj_only(model.prepare_context_hidden_for_kv(layer, context))
                k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
                out[f"k.{i}"] = k.reshape(-1, attn.num_kv_heads, attn.head_dim).clone()
                out[f"v.{i}"] = v.reshape(-1, attn.num_kv_heads, attn.head_dim).clone()
        save_file(out, str(work / f"{case}.sglang.safetensors"))
        attn = model.layers[0].self_attn
        report[case] = {
            "architecture": [cls.__module__, cls.__name__],
            "config_class": type(hf).__name__,
            "parsed": parsed,
            "model_block_size": model.block_size,
            "num_context_features": model.num_context_features,
            "attention": [
                [a.sliding_window_size, a.attn_type.value, a.scaling, a.v_scale]
                for a in (layer.self_attn for layer in model.layers)
            ],
            "dispatch": [
                op._forward_method.__name__
                for op in (model.hidden_norm, attn.k_norm, attn.rotary_emb)
            ],
        }

    _, model = model_of(work / BAD)
    try:
        model.load_weights(load_file(str(work / BAD / "model.safetensors")).items())
    except ValueError as err:
        report[BAD] = str(err)
    else:
        report[BAD] = "loaded"
    (work / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    assert os.environ.get("SGLANG_USE_CPU_ENGINE") == "1", "run by the contract fixture"
    sglang_side(Path(sys.argv[1]))
