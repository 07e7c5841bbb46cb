"""SGLang's offline engine with ISD (:func:`brisk.runtime.serving.engine.isd_engine`), in this
process and without a port, against brisk's own decode on the micro I-DLM.

The engine's scheduler runs in a spawned child process: this test checks that the CPU
stand-ins, ``SGLANG_USE_CPU_ENGINE`` and ``$BRISK_ISD_CONFIG`` reach it through the environment
:func:`isd_engine` sets, and that greedy decoding through it is brisk's ISD token for token.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.serving.real_server import task_prompts, train_micro_idlm

STRIDE = 4
MAX_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def micro_idlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_micro_idlm(tmp_path_factory.mktemp("micro_idlm"))


def test_engine_kwargs_are_the_flags_the_server_gets() -> None:
    from brisk.runtime.serving.engine import engine_kwargs
    from brisk.runtime.serving.launch import server_arguments

    flags, _ = server_arguments("m", isd={"stride": STRIDE}, env={})
    kwargs = engine_kwargs(flags)
    assert kwargs["model_path"] == "m"
    assert kwargs["device"] == "cpu"
    assert kwargs["speculative_algorithm"] == "BRISK_ISD"
    assert kwargs["speculative_num_draft_tokens"] == 2 * STRIDE - 1
    assert kwargs["max_total_tokens"] == 4096
    assert "port" not in kwargs
    assert "host" not in kwargs


def test_greedy_engine_generation_equals_brisk_decode(
    micro_idlm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions
    from brisk.runtime.serving.engine import isd_engine

    # the spawned scheduler shares this machine's cores with the suite: one thread each
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    # isd_engine sets these and the stand-ins on sys.path; the monkeypatch undoes both after
    for name in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH", "BRISK_ISD_CONFIG"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(sys, "path", list(sys.path))
    batch = task_prompts(micro_idlm, 4)
    reference = decode(HFBackbone.from_pretrained(micro_idlm), batch,
                       ISDOptions(stride=STRIDE, max_new_tokens=MAX_NEW_TOKENS))  # fmt: skip
    accepted = [L for r in reference.requests for L in r.accept_lengths]
    assert max(accepted) == STRIDE - 1, "the test needs rounds that accept the whole block"

    engine = isd_engine(micro_idlm, stride=STRIDE, dtype="float32", max_running_requests=8,
                        skip_server_warmup=True)  # fmt: skip
    try:
        params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        answers = engine.generate(input_ids=batch, sampling_params=params)
    finally:
        engine.shutdown()
    served = [a["output_ids"] for a in answers]
    for i, (want, got) in enumerate(zip(reference.tokens, served, strict=True)):
        assert got == want, f"prompt {i}: {want} != {got}"
    assert sum(a["meta_info"]["spec_verify_ct"] for a in answers) > 0, "ISD did not run"
