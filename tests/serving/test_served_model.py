"""What SGLang 0.5.23 builds from ``brisk serve``'s arguments, and what its HTTP server lets
through, without starting a server (the plugin loaded in this process, as in SGLang's).

- An I-DLM checkpoint (``SDARForCausalLM`` with its own configuration and model code) becomes
  SGLang's causal ``Qwen3ForCausalLM``, keeping ``mask_token_id`` and ``block_size``, with and
  without ``--trust-remote-code``; SGLang's own SDAR class attends bidirectionally.
- An architecture brisk cannot serve causally is refused while the arguments are built.
- The request guard's hooks sit where SGLang validates requests and refuse what a forward
  cannot take. The real servers answering 400 are ``test_idlm_server.py``'s.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from brisk.runtime.serving.engine import engine_kwargs
from brisk.runtime.serving.launch import server_arguments
from tests.serving.conftest import config_only_checkpoint
from tests.serving.real_server import sdar_checkpoint

pytestmark = pytest.mark.usefixtures("plugins")

OVERRIDE_FLAG = "--json-model-override-args"


def model_config(model: Path, extra_args: list[str], isd: bool = True) -> Any:
    """SGLang's ``ModelConfig`` from ``brisk serve``'s arguments, as every server process
    builds it."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    flags, _ = server_arguments(
        model, isd={"stride": 4} if isd else None, extra_args=extra_args, env={}
    )
    return ModelConfig.from_server_args(ServerArgs(**engine_kwargs(flags)))


@pytest.mark.parametrize("remote_code", [False, True], ids=["no-remote-code", "trust-remote-code"])
def test_an_idlm_checkpoint_is_served_as_the_causal_qwen3_it_is(
    tmp_path: Path, remote_code: bool
) -> None:
    from sglang.srt.model_loader.utils import get_model_architecture
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    model = sdar_checkpoint(
        config_only_checkpoint(tmp_path / "qwen3"), tmp_path / "sdar", block_size=3
    )
    config = model_config(model, ["--trust-remote-code"] if remote_code else [])
    hf = config.hf_config
    assert hf.architectures == ["Qwen3ForCausalLM"]
    assert hf.model_type == "qwen3"
    assert (hf.mask_token_id, hf.block_size) == (11, 3)  # what BRISK_ISD and I-DLM read
    assert (config.vocab_size, config.hidden_size) == (12, 32)
    model_class, _ = get_model_architecture(config)
    assert model_class is Qwen3ForCausalLM
    # why: SGLang's class for the checkpoint's own architecture is block diffusion's
    import sglang.srt.models.sdar as sdar

    assert "AttentionType.ENCODER_ONLY" in inspect.getsource(sdar.SDARAttention)
    assert "ENCODER_ONLY" not in inspect.getsource(inspect.getmodule(Qwen3ForCausalLM))


def test_overrides_passed_through_are_merged_and_win(tmp_path: Path) -> None:
    model = sdar_checkpoint(config_only_checkpoint(tmp_path / "qwen3"), tmp_path / "sdar")
    extra = [OVERRIDE_FLAG, '{"mask_token_id": 7}', "--max-running-requests", "4"]
    flags, _ = server_arguments(model, extra_args=extra, env={})
    assert flags.count(OVERRIDE_FLAG) == 1
    merged = json.loads(flags[flags.index(OVERRIDE_FLAG) + 1])
    assert merged == {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "mask_token_id": 7,
    }
    assert flags[-2:] == ("--max-running-requests", "4")
    assert model_config(model, extra, isd=False).hf_config.mask_token_id == 7
    plain = config_only_checkpoint(
        tmp_path / "plain"
    )  # a transformers causal LM: nothing to override
    assert OVERRIDE_FLAG not in server_arguments(plain, env={})[0]


@pytest.mark.parametrize(
    "architecture", ["LLaDA2MoeModelLM", "SDARMoeForCausalLM", "DiffusionGemmaForBlockDiffusion"]
)
def test_an_architecture_brisk_cannot_serve_causally_is_refused(
    tmp_path: Path, architecture: str
) -> None:
    model = config_only_checkpoint(tmp_path / "m", architectures=[architecture], model_type="x")
    with pytest.raises(
        ValueError,
        match=f"^model: {model} is a {architecture}, which brisk cannot serve as a causal LM",
    ):
        server_arguments(model, env={})


def test_the_guard_sits_where_sglang_validates_requests() -> None:
    """Both hooks wrap the targets (SGLang only logs a patch that fails), and the validation
    hook is the one SGLang's tokenizer manager calls for every request, single or batched."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from brisk.runtime.serving.plugin import _hooks_of

    assert "brisk.runtime.serving.guard:validate_request" in _hooks_of(
        TokenizerManager._validate_one_request
    )
    assert "brisk.runtime.serving.guard:check_inputs" in _hooks_of(
        GenerateReqInput.normalize_batch_and_arguments
    )
    source = inspect.getsource(TokenizerManager)
    assert source.count("self._validate_one_request(") >= 2  # _tokenize_one_request and batch


def manager(dtype: str = "float32") -> SimpleNamespace:
    """What the validation hook reads of SGLang's ``TokenizerManager``."""
    import torch

    config = SimpleNamespace(vocab_size=101, hidden_size=4, dtype=getattr(torch, dtype))
    return SimpleNamespace(model_config=config, mm_processor=None)


def request(**fields: object) -> Any:
    from sglang.srt.managers.io_struct import GenerateReqInput

    return GenerateReqInput(**{"sampling_params": {"max_new_tokens": 4}, **fields})


@pytest.mark.parametrize(
    ("fields", "ids", "dtype", "message"),
    [
        (
            {"input_ids": [1, 500]},
            [1, 500],
            "float32",
            "input_ids: token id 500 at position 1 is outside the vocabulary [0, 101)",
        ),
        (
            {"input_ids": [1, -5]},
            [1, -5],
            "float32",
            "input_ids: token id -5 at position 1 is outside the vocabulary [0, 101)",
        ),
        (
            {"input_ids": [101]},
            [101],
            "float32",
            "input_ids: token id 101 at position 0 is outside the vocabulary [0, 101)",
        ),
        ({"text": ""}, [], "float32", "input_ids: the prompt has no tokens"),
        (
            {"input_embeds": [[0.0] * 4]},
            None,
            "float32",
            "input_embeds: this server computes in float32 and SGLang passes input_embeds to the "
            "model in bfloat16",
        ),
        (
            {"input_embeds": [[0.0] * 3]},
            None,
            "bfloat16",
            "input_embeds: row 0 has 3 values; the model takes rows of its hidden size, 4",
        ),
        (
            {"input_embeds": [[0.0] * 4, [0.0] * 2]},
            None,
            "bfloat16",
            "input_embeds: row 1 has 2 values",
        ),
        (
            {"input_ids": [1, 5], "return_logprob": True, "top_logprobs_num": 500},
            [1, 5],
            "float32",
            "top_logprobs_num: 500 exceeds the vocabulary of 101",
        ),
    ],
    ids=[
        "id-500",
        "id-negative",
        "id-vocab",
        "no-tokens",
        "embeds-fp32",
        "embeds-hidden",
        "embeds-ragged",
        "top-logprobs",
    ],
)
def test_what_a_forward_cannot_take_is_a_value_error(
    fields: dict, ids: list[int] | None, dtype: str, message: str
) -> None:
    """A ``ValueError`` from the validation is what SGLang's HTTP server answers with a 400."""
    from brisk.runtime.serving.guard import validate_request

    def original(*args: object) -> str:
        return "validated by SGLang"

    with pytest.raises(ValueError, match="^" + re.escape(message)):
        validate_request(original, manager(dtype), request(**fields), ids)


def test_what_a_forward_takes_goes_on_to_sglangs_own_checks() -> None:
    from brisk.runtime.serving.guard import validate_request

    calls: list[tuple[Any, ...]] = []

    def original(*args: object) -> str:
        calls.append(args)
        return "validated by SGLang"

    good = [
        (request(input_ids=[0, 1, 100]), [0, 1, 100], "float32"),
        (request(text="7+5="), [1, 23, 17, 21, 29], "float32"),
        (request(input_embeds=[[0.5] * 4, [1, 2, 3, 4]]), None, "bfloat16"),
        (request(input_ids=[1], return_logprob=True, top_logprobs_num=101), [1], "float32"),
        # a session's next turn may bring no tokens: its history is the prompt (SGLang's rule)
        (request(input_ids=[], session_params={"id": "s-1"}), [], "float32"),
    ]
    for obj, ids, dtype in good:
        assert validate_request(original, manager(dtype), obj, ids) == "validated by SGLang"
    assert len(calls) == len(good)


@pytest.mark.parametrize("embeds", [[], [[]], "x"], ids=repr)
def test_input_embeds_sglang_would_index_out_of_range_are_a_value_error(embeds: Any) -> None:
    """``normalize_batch_and_arguments`` reads ``input_embeds[0][0]``: an IndexError (a 500)
    before, a ``ValueError`` naming the field now (through the hooked method itself)."""
    obj = request(input_embeds=embeds)
    with pytest.raises(ValueError, match=r"^input_embeds: expected non-empty"):
        obj.normalize_batch_and_arguments()
    fine = request(input_embeds=[[0.5, 0.5]])
    fine.normalize_batch_and_arguments()
    assert fine.is_single
