"""A real SGLang server running ISD as speculative algorithm ``BRISK_ISD`` (CPU engine, the
plugin, :class:`brisk.runtime.serving.worker.BriskISDWorker`), against brisk's own decode.

The model is a micro I-DLM base trained in the fixture (≈ 10 s), so its MASK slots propose
blocks the verifier accepts (accept lengths 0..M all occur) and the tests exercise partial and
full acceptance, the KV kept for accepted drafts and the cold starts after rejections. Exactness
holds for any weights; greedy equality needs only a clear top-1 margin, which is asserted.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from brisk.runtime.serving.launch import OVERRIDE_FLAG, server_launch
from brisk.runtime.serving.process import ServerProcess, free_port
from tests.serving.real_server import (
    RealServer,
    generate,
    greedy_reference,
    isd_server_args,
    post_generate,
    start_real_server,
    task_prompts,
    train_micro_idlm,
)

STRIDE = 4  # M = 3: verify rounds of 2M + 1 = 7 slots
MAX_NEW_TOKENS = 32
MIN_MARGIN = 1e-3  # ≫ float32 rounding of these logits: no near-tie to flip
CHUNK = 4  # --chunked-prefill-size of the chunked test: a task prompt prefills in ≥ 3 extends
TPF_LINE = re.compile(r"BRISK_ISD TPF ([0-9.]+): (\d+) committed tokens in (\d+) request-fo")
CLOCK_LINE = re.compile(r"BRISK_ISD decode forwards since start, by batch size: (.*)")
CLOCK_PART = re.compile(r"B=(\d+): (\d+) forwards, model ([0-9.]+) ms, host ([0-9.]+) ms")


@pytest.fixture(scope="module")
def micro_idlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_micro_idlm(tmp_path_factory.mktemp("micro_idlm"))


def _isd_server(
    workdir: Path, model: Path, temperature: float, extra_args: Sequence[str] = ()
) -> Iterator[RealServer]:
    """The options as a YAML file when greedy (with a block log at ``workdir/blocks``), inline
    JSON otherwise (both forms of the plugin config). SGLang's warm-up asks for 8 greedy
    tokens, which a T > 0 server refuses: it is skipped there. ``extra_args`` go to SGLang."""
    if temperature == 0:
        config = workdir / "isd.yaml"
        config.write_text(
            f"stride: {STRIDE}\ntemperature: {temperature}\nseed: 7\n"
            f"log_blocks: {workdir / 'blocks'}\n"
        )
        options: object = str(config)
    else:
        options = {"stride": STRIDE, "temperature": temperature, "seed": 7}
    args = isd_server_args(STRIDE, options)
    args += ["--skip-server-warmup"] if temperature > 0 else []
    args += extra_args
    # SGLang's own KV-leak check after every busy step: kept and freed slots must add up
    env = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}
    process, server = start_real_server(workdir, args, env, model)
    try:
        yield server
    finally:
        process.stop()


@pytest.fixture(scope="module")
def isd_server(micro_idlm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """The greedy ISD server, shared by this module's greedy tests and always stopped."""
    yield from _isd_server(tmp_path_factory.mktemp("isd_server"), micro_idlm, 0.0)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((t for t, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def test_greedy_completions_equal_brisk_decode(isd_server: RealServer) -> None:
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions

    batch = task_prompts(isd_server.model, 8)
    _, margin = greedy_reference(isd_server.model, batch, MAX_NEW_TOKENS)
    assert margin > MIN_MARGIN, f"the reference has a near-tie (gap {margin:.2e})"
    reference = decode(
        HFBackbone.from_pretrained(isd_server.model),
        batch,
        ISDOptions(stride=STRIDE, max_new_tokens=MAX_NEW_TOKENS),
    )
    accepted = [L for r in reference.requests for L in r.accept_lengths]
    assert max(accepted) == STRIDE - 1, "the test needs rounds that accept the whole block"
    assert min(accepted) == 0, "the test needs rounds that reject the first draft"
    body = {
        "input_ids": batch,
        "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": MAX_NEW_TOKENS},
    }
    served = post_generate(isd_server.url, body)
    for i, (want, got) in enumerate(zip(reference.requests, served, strict=True)):
        tokens, meta = got["output_ids"], got["meta_info"]
        assert tokens == want.tokens, (
            f"prompt {i}: first difference at {first_difference(want.tokens, tokens)}"
        )
        # the same forwards (prefill + every decode forward) and accepted drafts: the same TPF
        assert meta["spec_verify_ct"] + 1 == want.forwards, f"prompt {i}: forwards"
        assert meta["spec_num_correct_drafts"] == sum(want.accept_lengths), f"prompt {i}"
        assert meta["completion_tokens"] / (meta["spec_verify_ct"] + 1) == want.tpf


def test_the_server_verifies_drafts_and_counts_its_forwards(isd_server: RealServer) -> None:
    """SGLang's per-request counters: a verify forward commits accept + 1 tokens, so
    completion = 1 (the prefill's token) + forwards + accepted drafts, and TPF > 1."""
    (prompt,) = task_prompts(isd_server.model, 1, seed=1)
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": MAX_NEW_TOKENS},
    }
    meta = post_generate(isd_server.url, body)["meta_info"]
    forwards, accepted = meta["spec_verify_ct"], meta["spec_num_correct_drafts"]
    assert accepted > 0
    # the last round may commit past the budget; the scheduler cuts it
    assert meta["completion_tokens"] <= 1 + forwards + accepted
    assert meta["completion_tokens"] > 1 + forwards + accepted - STRIDE
    assert meta["completion_tokens"] / (forwards + 1) > 1.5
    # idle again, the worker logs the server's TPF: committed tokens ÷ request-forwards
    lines = _tpf_lines(isd_server.log, 1)
    assert lines, "the worker logged no TPF"
    tpf, tokens, request_forwards = lines[-1]
    assert float(tpf) == pytest.approx(int(tokens) / int(request_forwards), abs=5e-4)
    assert int(tokens) >= meta["completion_tokens"]


def _tpf_lines(log: Path, at_least: int) -> list[tuple[str, str, str]]:
    """The worker's idle TPF lines in the server log, once there are ``at_least`` (or 30 s)."""
    deadline = time.monotonic() + 30
    while len(lines := TPF_LINE.findall(log.read_text())) < at_least and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    return lines


def test_eight_concurrent_requests_equal_one_at_a_time(isd_server: RealServer) -> None:
    batch = task_prompts(isd_server.model, 8, seed=2)
    alone = [generate(isd_server.url, [p], MAX_NEW_TOKENS)[0] for p in batch]
    with ThreadPoolExecutor(len(batch)) as pool:
        together = list(pool.map(lambda p: generate(isd_server.url, [p], MAX_NEW_TOKENS)[0], batch))
    for i, (want, got) in enumerate(zip(alone, together, strict=True)):
        assert got == want, f"prompt {i}: first difference at {first_difference(want, got)}"


def test_a_request_the_algorithm_cannot_serve_exactly_is_refused(isd_server: RealServer) -> None:
    (prompt,) = task_prompts(isd_server.model, 1)
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0.7, "max_new_tokens": 4}}
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_generate(isd_server.url, body)
    assert refused.value.code == 400
    assert "temperature: BRISK_ISD serves greedy" in refused.value.read().decode()


def test_sampling_with_request_seeds_does_not_depend_on_the_batch(
    micro_idlm: Path, tmp_path: Path
) -> None:
    """T = 1: a request's tokens are a function of its prompt, seed and id (the uniforms'
    key), so 4 seeded requests give the same tokens batched together and one at a time."""
    batch = task_prompts(micro_idlm, 4, seed=3)
    seeds = [11, 12, 13, 14]

    def body(prompts: list[list[int]], seeds: list[int], rid: list[str]) -> dict[str, object]:
        params = [
            {
                "temperature": 1.0,
                "max_new_tokens": MAX_NEW_TOKENS,
                "ignore_eos": True,
                "sampling_seed": s,
            }
            for s in seeds
        ]
        return {"input_ids": prompts, "sampling_params": params, "rid": rid}

    rids = [f"seeded-{i}" for i in range(len(batch))]
    for server in _isd_server(tmp_path, micro_idlm, 1.0):
        together = [a["output_ids"] for a in post_generate(server.url, body(batch, seeds, rids))]
        # one at a time, after the batch finished: the same rids (keys) are free again
        alone = [
            post_generate(server.url, body([p], [s], [r]))[0]["output_ids"]
            for p, s, r in zip(batch, seeds, rids, strict=True)
        ]
    for i, (want, got) in enumerate(zip(alone, together, strict=True)):
        assert got == want, f"prompt {i}: first difference at {first_difference(want, got)}"
    greedy, _ = greedy_reference(micro_idlm, batch, MAX_NEW_TOKENS)
    assert together != greedy, "T = 1 sampled exactly the greedy tokens: sampling is not on"
    # brisk decode with the same seeds and request keys draws the same uniforms
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions
    from brisk.runtime.serving.common import request_key

    reference = decode(
        HFBackbone.from_pretrained(micro_idlm),
        batch,
        ISDOptions(stride=STRIDE, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS),
        seeds=seeds,
        request_ids=[request_key(r) for r in rids],
    )
    for i, (want, got) in enumerate(zip(reference.tokens, together, strict=True)):
        assert got == want, f"prompt {i}: first difference at {first_difference(want, got)}"


def test_a_verify_width_that_disagrees_with_the_stride_refuses_to_start(
    micro_idlm: Path, tmp_path: Path
) -> None:
    launch = server_launch(
        micro_idlm,
        free_port(),
        device="cpu",
        isd={"stride": STRIDE},
        extra_args=["--speculative-num-draft-tokens", "5"],
    )
    server = ServerProcess(launch, tmp_path / "log").start()
    try:
        with pytest.raises(RuntimeError, match="the server exited") as failed:
            server.wait_ready(timeout=240)
    finally:
        server.stop()
    want = (
        f"--speculative-num-draft-tokens: BRISK_ISD at stride {STRIDE} verifies "
        f"2N − 1 = {2 * STRIDE - 1} slots per request, got 5"
    )
    assert want in str(failed.value)


def test_brisk_serve_stride_launches_brisk_isd(micro_idlm: Path) -> None:
    command = (
        f"{sys.executable} -m brisk.cli serve --model {micro_idlm} --device cpu --stride 3 "
        f"--port 30123 --dry-run"
    ).split()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    words = shlex.split(line)
    assert json.loads(words[words.index(OVERRIDE_FLAG) + 1])["brisk"] == {"stride": 3}
    assert "--speculative-algorithm BRISK_ISD --speculative-num-draft-tokens 5" in line
    refused = subprocess.run(
        [*command[:-5], "--corrector", "x", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2
    assert refused.stderr.strip() == "brisk: error: --corrector: needs --stride (ISD decoding)"


def test_the_server_block_log_is_valid_and_counts_its_rounds(
    isd_server: RealServer, tmp_path: Path
) -> None:
    """One mechanism-format row per verify round, with SGLang's own counters (the rows'
    accepted drafts are the server's ``spec_num_correct_drafts``), and per request the accept
    lengths ``brisk decode`` logs for the same prompts, in order."""
    from brisk.mechanism import read_blocks
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions
    from brisk.runtime.serving.common import request_key

    # under torch.distributed (always, in SGLang) TP rank 0 writes its own rank folder
    logs = sorted((isd_server.log.parent / "blocks").glob("rank*"))
    assert [p.name for p in logs] == ["rank0"], "one TP rank, one block log"
    (log,) = logs
    batch = task_prompts(isd_server.model, 4, seed=4)
    rids = [f"logged-{i}" for i in range(len(batch))]
    body = {
        "input_ids": batch,
        "rid": rids,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
    }
    metas = [a["meta_info"] for a in post_generate(isd_server.url, body)]
    keys = {request_key(rid): meta for rid, meta in zip(rids, metas, strict=True)}

    def rows() -> dict[int, list[tuple[int, int]]]:
        found: dict[int, list[tuple[int, int]]] = {k: [] for k in keys}
        if not any(log.glob("part-*.parquet")):
            return found
        for part in read_blocks(log, ["request_id", "block_index", "accept_len"]):
            c = part.columns
            for r, b, L in zip(c["request_id"], c["block_index"], c["accept_len"], strict=True):
                if int(r) in found:
                    found[int(r)].append((int(b), int(L)))
        return found

    deadline = time.monotonic() + 30  # the worker flushes when it falls idle
    while not all(rows().values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    found = rows()
    reference = decode(
        HFBackbone.from_pretrained(isd_server.model),
        batch,
        ISDOptions(stride=STRIDE, max_new_tokens=MAX_NEW_TOKENS),
    )
    for (key, meta), want in zip(keys.items(), reference.requests, strict=True):
        rounds = sorted(found[key])
        assert rounds, "no block-log rows for a served request"
        assert [b for b, _ in rounds] == list(range(len(rounds))), "block indices 0, 1, …"
        assert [L for _, L in rounds] == want.accept_lengths
        assert len(rounds) <= meta["spec_verify_ct"]
        assert sum(L for _, L in rounds) == meta["spec_num_correct_drafts"]
    cli = [sys.executable, "-m", "brisk.cli", "mechanism"]
    validated = subprocess.run(
        [*cli, "validate", str(log.parent)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    report = subprocess.run(
        [*cli, "report", str(log.parent), "--out", str(tmp_path / "report"), "--bootstrap", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stdout + report.stderr


def test_a_prompt_prefilled_in_chunks_is_served_as_brisk_decode_serves_it(
    micro_idlm: Path, tmp_path: Path
) -> None:
    """A prompt longer than SGLang's ``--chunked-prefill-size`` runs as several extends, of which
    only the last is the prefill: it alone draws the first token (the request's uniforms at
    counter 0) and counts a forward. At T = 1 with seeds the tokens and, per request, the
    forwards and TPF are ``brisk decode``'s, and the worker counts the same request-forwards."""
    from brisk.runtime.backbone import HFBackbone
    from brisk.runtime.isd.loop import decode
    from brisk.runtime.isd.options import ISDOptions
    from brisk.runtime.serving.common import request_key

    batch = task_prompts(micro_idlm, 4, seed=5)
    assert min(map(len, batch)) > 2 * CHUNK, "the test needs prompts of ≥ 3 chunks"
    seeds = [21, 22, 23, 24]

    def body(rids: list[str]) -> dict[str, object]:
        params = [
            {
                "temperature": 1.0,
                "max_new_tokens": MAX_NEW_TOKENS,
                "ignore_eos": True,
                "sampling_seed": s,
            }
            for s in seeds
        ]
        return {"input_ids": batch, "sampling_params": params, "rid": rids}

    rounds = [[f"chunked-{r}-{i}" for i in range(len(batch))] for r in range(2)]
    answers, counts = [], []
    extra = ["--chunked-prefill-size", str(CHUNK)]
    for server in _isd_server(tmp_path, micro_idlm, 1.0, extra):
        for rids in rounds:  # the worker's count since start, before and after the second
            answers.append(post_generate(server.url, body(rids)))
            lines = _tpf_lines(server.log, len(counts) + 1)
            assert lines, "the worker logged no TPF"
            counts.append(int(lines[-1][2]))
    options = ISDOptions(stride=STRIDE, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
    backbone = HFBackbone.from_pretrained(micro_idlm)
    for rids, served in zip(rounds, answers, strict=True):
        reference = decode(
            backbone, batch, options, seeds=seeds, request_ids=[request_key(r) for r in rids]
        )
        for i, (want, got) in enumerate(zip(reference.requests, served, strict=True)):
            tokens, meta = got["output_ids"], got["meta_info"]
            assert tokens == want.tokens, (
                f"prompt {i}: first difference at {first_difference(want.tokens, tokens)}"
            )
            assert meta["spec_verify_ct"] + 1 == want.forwards, f"prompt {i}: forwards"
            assert meta["completion_tokens"] / (meta["spec_verify_ct"] + 1) == want.tpf
    # the second round's request-forwards, as the worker counts them: each prefill once
    assert counts[1] - counts[0] == sum(a["meta_info"]["spec_verify_ct"] + 1 for a in answers[1])


def test_the_worker_times_every_decode_forward_by_batch_size(isd_server: RealServer) -> None:
    """Idle, the worker logs per batch size B its decode forwards and their mean time in the
    model and around it: between two idle points the forwards it timed, each weighted by its B,
    are the served requests' verify forwards (SGLang's ``spec_verify_ct``)."""

    def idle_counts(at_least: int) -> tuple[int, int, int]:
        """Lines logged so far, request-forwards, Σ B × decode forwards (the last idle line)."""
        deadline = time.monotonic() + 30
        while True:
            text = isd_server.log.read_text()
            tpf, clock = TPF_LINE.findall(text), CLOCK_LINE.findall(text)
            if len(clock) >= at_least or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(clock) >= at_least, "the worker logged no forward times"
        assert len(tpf) == len(clock), "a TPF line and a forward-times line per idle point"
        parts = CLOCK_PART.findall(clock[-1])
        assert parts, clock[-1]
        assert all(float(model) > 0 and float(host) > 0 for _, _, model, host in parts)
        return len(clock), int(tpf[-1][2]), sum(int(b) * int(n) for b, n, _, _ in parts)

    generate(isd_server.url, task_prompts(isd_server.model, 1, seed=6), MAX_NEW_TOKENS)
    lines, forwards, timed = idle_counts(1)
    batch = task_prompts(isd_server.model, 3, seed=7)
    body = {
        "input_ids": batch,
        "sampling_params": {"temperature": 0, "ignore_eos": True, "max_new_tokens": MAX_NEW_TOKENS},
    }
    metas = [a["meta_info"] for a in post_generate(isd_server.url, body)]
    _, forwards_after, timed_after = idle_counts(lines + 1)
    verify = sum(m["spec_verify_ct"] for m in metas)
    assert timed_after - timed == verify
    assert forwards_after - forwards == verify + len(batch)  # and one prefill each
