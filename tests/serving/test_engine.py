"""SGLang's offline engine with ISD (:func:`brisk.runtime.serving.engine.isd_engine`), in this
process and without a port, against brisk's own decode on the micro I-DLM.

The engine's scheduler runs in a spawned child process: this test checks that the CPU
stand-ins and ``SGLANG_USE_CPU_ENGINE`` reach it through the environment :func:`isd_engine`
sets, ``BRISK_ISD``'s options through its arguments (the plugin config), and that greedy
decoding through it is brisk's ISD token for token.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.serving.real_server import micro_corrector, task_prompts, train_micro_idlm

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


def test_greedy_engine_generation_with_the_head_equals_brisk_decode(
    micro_idlm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head on (a random corrector that re-ranks the candidates): the engine's tokens, accept
    lengths (its verify and accepted-draft counters) and TPF are ``brisk decode``'s with the
    same head. The HTTP server's tests cover the head-off path."""
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.corrector import Corrector
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions
    from brisk.runtime.serving.engine import isd_engine

    # the spawned scheduler shares this machine's cores with the suite: one thread each
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    # isd_engine sets these and the stand-ins on sys.path; the monkeypatch undoes both after
    for name in ("SGLANG_USE_CPU_ENGINE", "PYTHONPATH"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(sys, "path", list(sys.path))
    head_dir = micro_corrector(micro_idlm, tmp_path / "head", STRIDE)
    head = Corrector.from_pretrained(head_dir)
    batch = task_prompts(micro_idlm, 4)
    backbone = HFBackbone.from_pretrained(micro_idlm)
    options = ISDOptions(stride=STRIDE, max_new_tokens=MAX_NEW_TOKENS, top_k=head.config.K)
    reference = decode(backbone, batch, options, corrector=head)
    accepted = [L for r in reference.requests for L in r.accept_lengths]
    assert max(accepted) == STRIDE - 1, "the test needs rounds that accept the whole block"
    plain = decode(backbone, batch, options)
    assert [r.accept_lengths for r in plain.requests] != [
        r.accept_lengths for r in reference.requests
    ], "the head drafts as the base does: the test would not see it"

    engine = isd_engine(
        micro_idlm,
        stride=STRIDE,
        options={"corrector": str(head_dir)},
        dtype="float32",
        max_running_requests=8,
        skip_server_warmup=True,
    )
    try:
        params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        answers = engine.generate(input_ids=batch, sampling_params=params)
    finally:
        engine.shutdown()
    for i, (want, got) in enumerate(zip(reference.requests, answers, strict=True)):
        assert got["output_ids"] == want.tokens, f"prompt {i}: {want.tokens} != {got['output_ids']}"
        meta = got["meta_info"]
        # the server's forwards (its prefill and every decode forward, cold starts included)
        # and accepted drafts (Σ L over verify rounds) are brisk decode's: the same TPF
        assert meta["spec_verify_ct"] + 1 == want.forwards, f"prompt {i}: forwards"
        assert meta["spec_num_correct_drafts"] == sum(want.accept_lengths), f"prompt {i}"
