"""The plugin inside SGLang 0.5.23 (light install, CPU): SGLang's own plugin loading finds it,
``BRISK_ISD`` and the hooks are in place, and what the server cannot serve stops it at launch
with one line naming the option.

The launch checks run through SGLang's own ``handle_speculative_decoding``, the hook its launch
pipeline runs while it resolves the server's arguments (``arg_groups/pipeline.py``), before any
model loads; it calls ``BriskISDSpec.handle_server_args`` through the recorder it hands foreign
algorithms. The arguments are the ones ``brisk serve`` gives the server
(:func:`~brisk.runtime.serving.launch.server_arguments`), the model a config-only checkpoint.
The full launch refusing with that line is ``tests/serving/test_isd_server.py``'s
``test_a_verify_width_that_disagrees_with_the_stride_refuses_to_start``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from brisk.runtime.serving.launch import OVERRIDE_FLAG, isd_flags
from brisk.runtime.serving.plugin import HOOKS, installed
from brisk.runtime.serving.worker import ALGORITHM
from tests.serving.conftest import config_only_checkpoint

pytestmark = pytest.mark.usefixtures("plugins")


def checkpoint(tmp_path: Path, **overrides: object) -> Path:
    """A config-only checkpoint: what server-args resolution reads."""
    return config_only_checkpoint(tmp_path / "model", **overrides)


def launch(
    monkeypatch: pytest.MonkeyPatch,
    model: Path,
    options: dict[str, object],
    extra_args: Sequence[str] = (),
    overrides: dict[str, object] | None = None,
) -> object:
    """Resolve SGLang's arguments for ``model`` with ``options`` as the plugin config (the
    model config's ``brisk`` key, beside the ``overrides``), as SGLang's launcher does for the
    speculative algorithm, unchecked by brisk's launcher; the resolved ``ServerArgs``."""
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import ServerArgs

    from brisk.runtime.serving.engine import engine_kwargs
    from brisk.runtime.serving.launch import server_arguments

    stride = options.get("stride", 4)
    width = stride if isinstance(stride, int) and stride >= 2 else 4  # the flags need a stride
    config = json.dumps({**(overrides or {}), "brisk": options})
    passed = [*isd_flags(width), *extra_args, OVERRIDE_FLAG, config]
    flags, _ = server_arguments(model, extra_args=passed, env={})
    server_args = ServerArgs(**engine_kwargs(flags))
    handle_speculative_decoding(server_args)
    return server_args


def test_load_plugins_registers_the_speculative_algorithm() -> None:
    from sglang.srt.dllm.algorithm import algo_name_to_cls
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from brisk.runtime.serving.worker import BriskISDSpec

    spec = SpeculativeAlgorithm.from_string(ALGORITHM)
    assert isinstance(spec, BriskISDSpec)
    assert spec.is_ngram()  # the scheduler's paths for a speculator without a draft model
    assert not spec.has_draft_kv()
    assert SpeculativeAlgorithm.from_string("NGRAM") is SpeculativeAlgorithm.NGRAM  # SGLang's own
    assert "BriskISD" not in algo_name_to_cls  # the retired dLLM route registers nothing


def test_every_hook_is_applied() -> None:
    """SGLang logs a hook that fails to apply: assert each target is wrapped by brisk's hook."""
    assert installed() == dict.fromkeys(HOOKS, True)


def test_server_args_resolve_on_a_config_only_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = launch(monkeypatch, checkpoint(tmp_path), {"stride": 4, "temperature": 0})
    assert sa.speculative_algorithm == ALGORITHM  # type: ignore[attr-defined]
    assert sa.speculative_num_draft_tokens == 7  # type: ignore[attr-defined]  # 2N − 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stride": 4, "blocksize": 7}, "blocksize: unknown BriskISD option"),
        ({"stride": 1}, "stride: need an integer N ≥ 2"),
        ({"stride": "4"}, "stride: need an integer N ≥ 2, got '4'"),
        ({"stride": 4, "block_size": 4}, "block_size: BriskISD's block is 2N − 1 = 7"),
        ({"temperature": -1}, "temperature: need a number ≥ 0"),
        ({"impl": "cuda"}, "impl: need auto, naive or triton"),
        ({"shadow": True}, "shadow: needs a corrector"),
        ({"corrector": "/nonexistent"}, "corrector: /nonexistent holds no corrector"),
    ],
)
def test_bad_options_name_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict, message: str
) -> None:
    from brisk.runtime.serving.options import OptionError

    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        launch(monkeypatch, checkpoint(tmp_path), options)


def test_a_verify_width_other_than_the_strides_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brisk.runtime.serving.options import OptionError

    want = "--speculative-num-draft-tokens: BRISK_ISD at stride 4 verifies 2N − 1 = 7 slots"
    with pytest.raises(OptionError, match=want):
        launch(
            monkeypatch,
            checkpoint(tmp_path),
            {"stride": 4},
            ["--speculative-num-draft-tokens", "5"],
        )


def test_a_model_without_a_mask_token_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused with the way out the message names, which SGLang's model config honours."""
    from brisk.runtime.serving.options import OptionError

    model = checkpoint(tmp_path, mask_token_id=None)
    with pytest.raises(OptionError, match=r"--model-path: .* declares no integer mask_token_id"):
        launch(monkeypatch, model, {"stride": 4})
    launch(monkeypatch, model, {"stride": 4}, overrides={"mask_token_id": 11})
    with pytest.raises(OptionError, match="mask_token_id 12 is outside its vocabulary of 12"):
        launch(monkeypatch, checkpoint(tmp_path / "v12", mask_token_id=12), {"stride": 4})


def test_a_stride_the_models_positions_cannot_hold_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brisk.runtime.serving.options import OptionError

    model = checkpoint(tmp_path, max_position_embeddings=8)
    launch(monkeypatch, model, {"stride": 4})  # 7 verify slots after one token: 8 positions
    want = r"stride: N = 5 verifies 2N − 1 = 9 slots after a request's tokens; .* has 8 positions"
    with pytest.raises(OptionError, match=want):
        launch(monkeypatch, model, {"stride": 5})


@pytest.mark.parametrize(
    ("head", "options", "message"),
    [
        (
            {"M": 3, "K": 4, "hidden": 32, "vocab": 12},
            {"stride": 5},
            "corrector: built for M = 3, stride 5 gives M = 4",
        ),
        (
            {"M": 3, "K": 4, "hidden": 64, "vocab": 12},
            {"stride": 4},
            "corrector: trained for hidden 64 / vocab 12, .* has 32 / 12",
        ),
        (
            {"M": 3, "K": 4, "hidden": 32, "vocab": 16},
            {"stride": 4},
            "corrector: trained for hidden 32 / vocab 16, .* has 32 / 12",
        ),
        (
            {"M": 3, "K": 4, "hidden": 32, "vocab": 12},
            {"stride": 4, "top_k": 8},
            "top_k: the corrector at .* ranks K = 4 candidates",
        ),
    ],
)
def test_a_corrector_for_another_backbone_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: dict, options: dict, message: str
) -> None:
    from brisk.runtime.corrector import Corrector, CorrectorConfig
    from brisk.runtime.serving.options import OptionError

    Corrector(
        CorrectorConfig.small(head["hidden"], head["vocab"], M=head["M"], K=head["K"])
    ).save_pretrained(tmp_path / "head")
    with pytest.raises(OptionError, match=message):
        launch(monkeypatch, checkpoint(tmp_path), {"corrector": str(tmp_path / "head"), **options})


def test_a_corrector_that_fits_is_admitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from brisk.runtime.corrector import Corrector, CorrectorConfig

    Corrector(CorrectorConfig.small(32, 12, M=3, K=4)).save_pretrained(tmp_path / "head")
    launch(monkeypatch, checkpoint(tmp_path), {"stride": 4, "corrector": str(tmp_path / "head")})


def test_requests_the_algorithm_cannot_serve_are_rejected() -> None:
    """What the worker refuses at a request's prefill (the real server answers 400 with it:
    ``test_isd_server.py``'s ``test_a_request_the_algorithm_cannot_serve_exactly_is_refused``)."""
    from brisk.runtime.serving.common import validate_sampling

    def params(**given: object) -> SimpleNamespace:
        return SimpleNamespace(
            **{"temperature": 0.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0, **given}
        )

    assert validate_sampling(params(), 0.0) is None
    assert validate_sampling(params(temperature=0.7, top_k=1), 0.0) is None  # top-k 1: greedy
    assert validate_sampling(params(temperature=1.0, top_k=1 << 30), 1.0) is None  # k: "all"
    assert "asks for temperature 0.7" in validate_sampling(params(temperature=0.7), 0.0)
    assert "asks for greedy" in validate_sampling(params(), 1.0)
    assert "asks for temperature 0.5" in validate_sampling(params(temperature=0.5), 1.0)
    for name, value in [("top_p", 0.9), ("top_k", 20), ("min_p", 0.1)]:
        why = validate_sampling(params(temperature=1.0, **{name: value}), 1.0)
        assert why == f"{name}: not supported; BRISK_ISD verifies plain sampling from p"
    refused: list[tuple[str, object]] = [
        ("repetition_penalty", 1.2),
        ("frequency_penalty", 0.5),
        ("presence_penalty", 0.5),
        ("min_new_tokens", 3),
        ("json_schema", "{}"),
        ("regex", "a+"),
        ("logit_bias", {"1": 2.0}),
    ]
    for name, value in refused:
        why = validate_sampling(params(**{name: value}), 0.0)
        assert why == f"{name}: not supported; BRISK_ISD verifies against the model's p"


def test_brisk_without_the_plugin_imports_nothing_of_sglang() -> None:
    """Even where SGLang is installed, brisk (its CLI, the serving options, benchmark and
    loopback server included) imports SGLang only when SGLang loads the plugin."""
    import subprocess
    import sys

    code = (
        "import sys, brisk, brisk.cli, brisk.runtime.serving.options, "
        "brisk.runtime.serving.bench, brisk.runtime.serving.bench_summary, "
        "brisk.runtime.serving.loopback, "
        "brisk.runtime.serving.plugin, brisk.runtime.serving.dflash, "
        "brisk.runtime.serving.common, brisk.runtime.serving.launch, "
        "brisk.runtime.serving.process, brisk.runtime.serving.drafter_options, "
        "brisk.runtime.serving.engine; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
