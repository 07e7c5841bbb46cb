"""The DFlash-shaped drafter and speculative decoding with an AR target.

- Greedy speculative decoding equals the target's greedy decoding token for token (a plain
  recompute of the whole sequence each token, no cache), over block sizes 2..8 and prompts
  whose rounds accept and reject.
- Sampled drafts (the drafter's softmax, its Top-K) at T = 1: the first three output tokens of
  n = 500 requests against the target's exact law of three tokens (all V³ sequences scored),
  Pearson's χ² over the cells with expected count ≥ 5 (the rest pooled, 34 cells): p > 0.001.
  Fixed seeds. Negative control: argmax drafts verified as if drawn from the softmax (the
  approximately lossless shortcut) must fail the same test with p < 1e-6.

  Power (n = 500, 33 degrees of freedom): the negative control's law is Cohen's w ≈ 1.8 from the
  target's (measured on 2,000 draws, sampling bias removed), a noncentrality n·w² ≈ 1,600
  against the critical χ² of 87 at α = 1e-6: it passes with probability below 1e-80 (the
  Laurent–Massart bound; its observed p underflows to 0). A deviation of w = 0.37, a fifth of
  it and below the w ≈ 0.5 of the head's mislabelled law in test_drafter_corrector, fails the
  exact-law test at α = 1e-3 with power 0.99. n = 2,000 took 4× as long, to detect w = 0.21.
- The checkpoint is DFlash's format: its keys, a save/load round trip, a ``model.`` prefix
  accepted, and one line naming the file and key for what is missing, extra or misshapen.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import chisquare
from transformers import Qwen3Config, Qwen3ForCausalLM

import brisk.runtime.drafter.speculative as sd
from brisk.cli import main
from brisk.mechanism import validate
from brisk.runtime.drafter import (
    DFlashDrafter,
    SDOptions,
    drafter_config,
    load_drafter,
    save_drafter,
    speculative_decode,
)
from brisk.runtime.isd.blocklog import BlockLogger

pytestmark = pytest.mark.usefixtures("one_torch_thread")


V = 4  # small enough to enumerate every three-token output


def tiny_target(vocab: int, scale: float, seed: int = 0) -> Qwen3ForCausalLM:
    """A random 4-layer Qwen3 target; ``scale`` sharpens its law (the LM head's weights)."""
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=96,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    target = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(scale)
    return target


def tiny_drafter(target: Qwen3ForCausalLM, block_size: int, seed: int = 1) -> DFlashDrafter:
    torch.manual_seed(seed)
    config = drafter_config(
        target.config,
        num_layers=1,
        block_size=block_size,
        mask_token_id=target.config.vocab_size - 1,
        target_layer_ids=[1, 2],
    )
    return DFlashDrafter(config).eval()


def greedy_reference(target: Qwen3ForCausalLM, prompt: list[int], n: int) -> list[int]:
    """The target's greedy decoding, each token from a forward over the whole sequence."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_greedy_speculative_decoding_is_the_targets_greedy_decoding(block_size: int) -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, block_size)
    prompts = [[0, 1, 2, 3], [0, 4], [5, 5, 1, 0, 2, 2, 3]]
    result = speculative_decode(target, drafter, prompts, SDOptions(max_new_tokens=40))
    for prompt, out in zip(prompts, result.outputs, strict=True):
        assert out.tokens == greedy_reference(target, prompt, 40)
        assert out.finished == "length"
        assert out.target_forwards == 1 + len(out.accept_lengths)
        assert sum(L + 1 for L in out.accept_lengths) + 1 >= 40
    lengths = [L for out in result.outputs for L in out.accept_lengths]
    assert max(lengths) >= 1  # rounds that accepted: the cache was cut back after partial blocks
    assert min(lengths) < block_size - 1  # and rounds that rejected
    assert result.tpf == pytest.approx(120 / sum(o.target_forwards for o in result.outputs))


def test_decoding_stops_at_eos_and_keeps_it() -> None:
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    free = greedy_reference(target, [0, 1, 2, 3], 40)
    eos = free[5]
    options = SDOptions(max_new_tokens=40, eos_token_id=eos)
    out = speculative_decode(target, drafter, [[0, 1, 2, 3]], options).outputs[0]
    assert out.tokens == free[: free.index(eos) + 1]
    assert out.finished == "eos"


def exact_law(target: Qwen3ForCausalLM, prompt: list[int]) -> dict[tuple[int, ...], float]:
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(V), repeat=3):
            logp = target(torch.tensor([prompt + list(seq)])).logits[0].double().log_softmax(-1)
            start = len(prompt) - 1
            law[seq] = float(sum(logp[start + i, t] for i, t in enumerate(seq)).exp())
    return law


def chi2_pvalue(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float]) -> float:
    n = len(samples)
    cells = list(law)
    observed = np.array([sum(1 for s in samples if s == c) for c in cells], float)
    expected = np.array([law[c] for c in cells])
    expected *= n / expected.sum()
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    return float(chisquare(observed, expected).pvalue)


N_SAMPLES, PROMPT = 500, [0, 1]  # sized by the power calculation in the module docstring


@pytest.fixture(scope="module")
def sampled_world() -> tuple[Qwen3ForCausalLM, DFlashDrafter, dict[tuple[int, ...], float]]:
    target = tiny_target(V, scale=3.0)
    return target, tiny_drafter(target, 3), exact_law(target, PROMPT)


def sample_outputs(
    world: tuple[Qwen3ForCausalLM, DFlashDrafter, object], draft: sd.DraftLaw
) -> list[tuple[int, ...]]:
    target, drafter, _ = world
    options = SDOptions(temperature=1.0, draft=draft, top_k=2, max_new_tokens=3)
    seeds = list(range(N_SAMPLES))
    result = speculative_decode(target, drafter, [PROMPT] * N_SAMPLES, options, seeds=seeds)
    assert result.mean_accept > 0.3  # drafts were accepted: verification did the work
    return [tuple(o.tokens) for o in result.outputs]


@pytest.mark.parametrize("draft", ["sample", "top-k"])
def test_sampled_drafts_follow_the_targets_law(
    sampled_world: tuple[Qwen3ForCausalLM, DFlashDrafter, dict[tuple[int, ...], float]],
    draft: sd.DraftLaw,
) -> None:
    assert chi2_pvalue(sample_outputs(sampled_world, draft), sampled_world[2]) > 1e-3


def test_negative_control_argmax_drafts_verified_as_sampled_fail(
    sampled_world: tuple[Qwen3ForCausalLM, DFlashDrafter, dict[tuple[int, ...], float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sd, "sample_inverse_cdf", lambda weights, u: weights.argmax(-1))
    assert chi2_pvalue(sample_outputs(sampled_world, "sample"), sampled_world[2]) < 1e-6


# -- the checkpoint format

DFLASH_LAYER_KEYS = {
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
}


def test_a_saved_drafter_is_a_dflash_checkpoint_and_loads_back(tmp_path: Path) -> None:
    target = tiny_target(6, scale=1.0)
    drafter = tiny_drafter(target, 4)
    save_drafter(drafter, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert (config["block_size"], config["num_target_layers"]) == (4, 4)
    assert config["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [1, 2]}
    weights = load_file(tmp_path / "d" / "model.safetensors")
    expected = {f"layers.0.{k}" for k in DFLASH_LAYER_KEYS}
    assert set(weights) == expected | {"norm.weight", "fc.weight", "hidden_norm.weight"}
    assert tuple(weights["fc.weight"].shape) == (32, 64)
    loaded = load_drafter(tmp_path / "d")
    prompts, options = [[0, 1, 2, 3, 4]], SDOptions(max_new_tokens=30)
    runs = [speculative_decode(target, d, prompts, options).outputs[0] for d in (drafter, loaded)]
    assert runs[0].accept_lengths == runs[1].accept_lengths  # the drafter's proposals, equal
    prefixed = {f"model.{k}": v for k, v in weights.items()}  # how some exports name them
    save_file(prefixed, tmp_path / "d" / "model.safetensors")
    assert torch.equal(load_drafter(tmp_path / "d").fc.weight, drafter.fc.weight)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda w: w.pop("hidden_norm.weight"), "lacks hidden_norm.weight"),
        (lambda w: w.update(embed=torch.zeros(1)), "has embed, which a DFlash drafter has not"),
        (lambda w: w.update({"fc.weight": torch.zeros(32, 96)}), "fc.weight has shape (32, 96)"),
    ],
)
def test_a_broken_checkpoint_is_named_in_one_line(
    tmp_path: Path, edit: object, message: str
) -> None:
    drafter = tiny_drafter(tiny_target(6, scale=1.0), 4)
    save_drafter(drafter, tmp_path / "d")
    weights = dict(load_file(tmp_path / "d" / "model.safetensors"))
    edit(weights)  # type: ignore[operator]
    save_file(weights, tmp_path / "d" / "model.safetensors")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_drafter(tmp_path / "d")


def test_a_drafter_for_another_target_is_refused() -> None:
    target = tiny_target(6, scale=1.0)
    wide = Qwen3Config(**{**target.config.to_dict(), "hidden_size": 48})
    other_vocab = Qwen3Config(**{**target.config.to_dict(), "vocab_size": 8})
    deep_ids = drafter_config(target.config, mask_token_id=5, target_layer_ids=[2])
    deep_ids.dflash_config["target_layer_ids"] = [7]
    deep_ids.num_target_layers = 8
    for config, message in (
        (drafter_config(wide, mask_token_id=5), "hidden size 48, the target's is 32"),
        (drafter_config(other_vocab, mask_token_id=5), "vocabulary 8, the target's is 6"),
        (deep_ids, "name layers the target"),
    ):
        with pytest.raises(ValueError, match=message):
            speculative_decode(target, DFlashDrafter(config), [[0, 1]], SDOptions(max_new_tokens=8))
    with pytest.raises(ValueError, match="exceeds the target's 96 positions"):
        speculative_decode(
            target, tiny_drafter(target, 8), [[0] * 50], SDOptions(max_new_tokens=40)
        )


# -- block logs


@pytest.mark.parametrize(("temperature", "draft"), [(0.0, "greedy"), (1.0, "top-k")])
def test_the_loops_block_log_is_a_mechanism_log_the_report_reads(
    tmp_path: Path, temperature: float, draft: sd.DraftLaw
) -> None:
    """Every round a row (its L as the loop's), every request a row of the request table, the
    verification declared; ``brisk mechanism report`` reads it with no contradictions."""
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    options = SDOptions(temperature=temperature, draft=draft, top_k=3, max_new_tokens=30)
    path = tmp_path / "blocks"
    with BlockLogger(path, M=3, K=3, decoder="speculative") as logger:
        result = speculative_decode(target, drafter, [[0, 1, 2], [3, 4]], options, logger=logger)
    rounds = sum(len(o.accept_lengths) for o in result.outputs)
    assert validate(path) == rounds
    report = tmp_path / "report"
    assert main(["mechanism", "report", str(path), "--out", str(report), "--bootstrap", "20"]) == 0
    summary = json.loads((report / "summary.json").read_text())
    assert summary["blocks"] == rounds
    assert summary["verification"]["rule"] == ("greedy" if temperature == 0 else "sampled")
    assert summary["verification"]["contradictions"] == 0
    tokens = sum(len(o.tokens) for o in result.outputs)
    assert summary["decoder"] == "speculative"
    assert summary["tpf"]["whole_run"] == pytest.approx(tokens / (rounds + 2))
    lengths = [L for o in result.outputs for L in o.accept_lengths]
    assert summary["tpf"]["complete_cycles"] == pytest.approx(
        sum(L + 1 for L in lengths) / len(lengths)
    )
    other = BlockLogger(tmp_path / "other", M=3, K=5, decoder="speculative")
    with pytest.raises(ValueError, match="logger: holds M = 3, K = 5"):
        speculative_decode(target, drafter, [[0]], options, logger=other)
    isd = BlockLogger(tmp_path / "i", 3, 3)
    with pytest.raises(ValueError, match="logger: writes 'isd' logs"):
        speculative_decode(target, drafter, [[0]], options, logger=isd)


def test_target_layers_and_the_mask_id_are_checked_where_the_config_is_made() -> None:
    """What a server needs of them: layers in increasing order (it captures each once, in layer
    order), none the last (whose output it never captures), a mask id inside the vocabulary."""
    config = tiny_target(6, scale=1.0).config
    for kwargs, message in (
        ({"target_layer_ids": [2, 1]}, "target_layer_ids must increase"),
        ({"target_layer_ids": [1, 1]}, "target_layer_ids must increase"),
        ({"target_layer_ids": [3]}, "each must be at most L − 2 = 2"),
        ({"target_layer_ids": []}, "give at least one layer"),
        ({"mask_token_id": 6}, "mask_token_id 6 is outside the vocabulary 0..5"),
    ):
        with pytest.raises(ValueError, match=message):
            drafter_config(config, **{"mask_token_id": 5, **kwargs})  # type: ignore[arg-type]


def test_an_accepted_eos_ends_the_request_at_that_round() -> None:
    """An EOS among a round's accepted drafts ends the request there: no forward runs after
    the round that committed it (the output is the same either way; the forwards are not)."""
    target = tiny_target(6, scale=3.0)
    drafter = tiny_drafter(target, 4)
    prompts = [[0, 1, 2, 3], [0, 4], [5, 5, 1, 0, 2, 2, 3]]
    free = speculative_decode(target, drafter, prompts, SDOptions(max_new_tokens=40))
    found = None  # (prompt, eos): a token first output as an accepted draft
    for prompt, out in zip(prompts, free.outputs, strict=True):
        at = 1  # the prefill committed output token 0
        for L in out.accept_lengths:
            for j in range(at, at + L):
                if out.tokens[j] not in out.tokens[:j] and found is None:
                    found = (prompt, out.tokens[j])
            at += L + 1
    assert found is not None, "no round accepted a draft: the test needs one"
    prompt, eos = found
    out = speculative_decode(
        target, drafter, [prompt], SDOptions(max_new_tokens=40, eos_token_id=eos)
    ).outputs[0]
    assert out.finished == "eos"
    before_last = 1 + sum(L + 1 for L in out.accept_lengths[:-1])
    assert before_last < len(out.tokens) <= before_last + out.accept_lengths[-1] + 1
    assert out.target_forwards == 1 + len(out.accept_lengths)


def damage(directory: Path, how: str) -> None:
    """Damage a saved drafter as a user's copy might be: weights cut short or replaced, a
    config edited by hand."""
    weights, config_file = directory / "model.safetensors", directory / "config.json"
    config = json.loads(config_file.read_text())
    if how == "truncated-weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "garbage-weights":
        weights.write_bytes(b"\x00garbage" * 64)
    elif how == "invalid-json":
        config_file.write_text('{\n  "block_size": 4,\n  oops\n}')
    elif how == "json-list":
        config_file.write_text("[1, 2]")
    else:
        edits = {
            "no-hidden-size": lambda: config.pop("hidden_size"),
            "no-dflash-config": lambda: config.pop("dflash_config"),
            "no-mask-id": lambda: config["dflash_config"].pop("mask_token_id"),
            "layers-not-int": lambda: config.update(num_hidden_layers="two"),
        }
        edits[how]()
        config_file.write_text(json.dumps(config))


DAMAGES = {
    "truncated-weights": "model.safetensors: not a readable safetensors file",
    "garbage-weights": "model.safetensors: not a readable safetensors file",
    "invalid-json": "config.json: invalid JSON at line 3, column 3",
    "json-list": "config.json: holds no JSON object",
    "no-hidden-size": 'config.json: no "hidden_size" field',
    "no-dflash-config": 'config.json: no "dflash_config" field',
    "no-mask-id": "config.json: dflash_config.mask_token_id must be an integer, got None",
    "layers-not-int": "config.json: \"num_hidden_layers\" must be an integer ≥ 1, got 'two'",
}


@pytest.mark.parametrize("how", list(DAMAGES))
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path: Path, how: str) -> None:
    """What a user meets on a checkpoint copied in part or edited by hand: one ``ValueError``
    line naming the file (and the JSON line and column, or the field), never safetensors' or
    json's own exception."""
    save_drafter(tiny_drafter(tiny_target(6, scale=1.0), 4), tmp_path / "d")
    damage(tmp_path / "d", how)
    with pytest.raises(ValueError, match="drafter: ") as caught:
        load_drafter(tmp_path / "d")
    text = str(caught.value)
    assert type(caught.value) is ValueError, type(caught.value)  # not JSONDecodeError
    assert "\n" not in text
    assert str(tmp_path / "d") in text
    assert DAMAGES[how] in text, text


def test_a_drafter_for_a_target_of_another_depth_is_refused() -> None:
    """Target layer ids inside the target, but the drafter was built for a deeper one."""
    target = tiny_target(6, scale=1.0)
    config = drafter_config(target.config, mask_token_id=5, target_layer_ids=[1, 2])
    config.num_target_layers = 8
    with pytest.raises(ValueError, match="built for a target of 8 layers, the target has 4"):
        speculative_decode(target, DFlashDrafter(config), [[0, 1]], SDOptions(max_new_tokens=8))
