"""A DFlash-format drafter verified by an AR target, served by a real SGLang CPU server through
``brisk serve --model TARGET --drafter DIR`` (speculative algorithm ``BRISK_DRAFTER``,
:class:`brisk.runtime.serving.drafter_worker.BriskDrafterWorker`).

The target is the micro Llama of :mod:`tests.llama_micro` (byte-level BPE, ChatML specials, no
MASK token). The drafter is fitted in the fixture (a few seconds) to the target's greedy
continuations of the test's prompts, from the target's own features, so its blocks are accepted
in part (accept lengths 0..M all occur) and the tests exercise partial and full acceptance and
the drafter context kept from the verify forwards; exactness holds for any drafter.

Every greedy answer, through ``/generate`` (ids and text), ``/v1/completions``,
``/v1/chat/completions`` and concurrent requests, is the target's greedy decoding (transformers,
the whole sequence's forward and argmax per token) token for token, and its verify forwards and
accepted drafts are those of brisk's own loop (:func:`brisk.runtime.drafter.speculative_decode`)
with the same drafter: the served drafter sees the same features and drafts the same blocks. A
drafter built for another target is refused in one line before SGLang starts.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from brisk.runtime.serving.launch import OVERRIDE_FLAG, server_launch
from brisk.runtime.serving.process import ServerProcess, free_port
from tests.llama_micro import llama_without_mask
from tests.serving.real_server import (
    RealServer,
    greedy_reference,
    post_json,
    start_brisk_serve,
    start_real_server,
)

BLOCK = 3  # the drafter's block: [pending, 2 drafts]
MAX_NEW_TOKENS = 24
MIN_MARGIN = 1e-3  # ≫ float32 rounding of these logits: no near-tie to flip
TEXTS = [
    "def dumps(obj, *, skipkeys=False):\n",
    "import json\n\nclass Decoder:",
    "température °C → K, «exact»",
    '    """Return a string',
    "for line in lines:\n    if",
    "textwrap.dedent(",
]
CHAT = [{"role": "user", "content": "Wrap this text, please."}]


@dataclass(frozen=True)
class World:
    target: Path
    drafter: Path
    prompts: list[list[int]]  # TEXTS as the server tokenizes them
    chat_prompt: list[int]  # CHAT through the chat template


def fit_drafter(
    target_dir: Path, sequences: list[list[int]], out: Path, steps: int = 200, lr: float = 2e-2
) -> Path:
    """A drafter for ``target_dir`` fitted to ``sequences`` (prompt + greedy continuation): at
    every anchor s, the block ``[x_s, MASK × M]`` against the target features of positions < s
    learns x_{s+1}..x_{s+M} (cross-entropy through the target's LM head), Adam, ``steps``
    full-batch steps. Seeded, so the checkpoint is the same on every run."""
    import torch
    from transformers import AutoModelForCausalLM

    from brisk.runtime.drafter import DFlashDrafter, drafter_config, save_drafter

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with torch.random.fork_rng():
        torch.manual_seed(3)
        config = drafter_config(
            target.config, num_layers=1, block_size=BLOCK, mask_token_id=0, target_layer_ids=[1, 2]
        )
        drafter = DFlashDrafter(config)
    M, embed, head = BLOCK - 1, target.get_input_embeddings(), target.get_output_embeddings()
    rows = []  # (features [N, k·H], ids [N], anchor s)
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            features = drafter.features(target(ids, output_hidden_states=True).hidden_states)[0]
            rows += [(features, ids[0], s) for s in range(1, len(seq) - M)]
    N = max(len(f) for f, _, _ in rows)
    B = len(rows)
    feats = torch.zeros(B, N, rows[0][0].shape[-1])
    block = torch.zeros(B, M + 1, dtype=torch.long)
    labels = torch.zeros(B, M, dtype=torch.long)
    positions = torch.zeros(B, M + 1, dtype=torch.long)
    seen = torch.zeros(B, N, dtype=torch.bool)
    for b, (f, ids, s) in enumerate(rows):
        feats[b, : len(f)] = f
        block[b, 0], labels[b] = ids[s], ids[s + 1 : s + 1 + M]
        positions[b] = torch.arange(s, s + M + 1)
        seen[b, :s] = True
    mask = torch.cat([seen, seen.new_ones(B, M + 1)], 1)[:, None, None].expand(-1, 1, M + 1, -1)
    block[:, 1:] = config.dflash_config["mask_token_id"]
    with torch.no_grad():
        embeds = embed(block)
    context_positions = torch.arange(N).expand(B, N)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=lr)
    for _ in range(steps):
        kv = drafter.context_kv(drafter.project(feats), context_positions)
        hidden = drafter(embeds, positions, kv, mask)[:, 1:]
        loss = torch.nn.functional.cross_entropy(head(hidden).flatten(0, 1), labels.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return save_drafter(drafter.eval(), out)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    import torch
    from transformers import AutoTokenizer

    work = tmp_path_factory.mktemp("drafter_world")
    torch.set_num_threads(1)
    target = llama_without_mask(work / "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer(t).input_ids for t in TEXTS]
    chat = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=True)
    chat_prompt = list(chat["input_ids"])
    outputs, margin = greedy_reference(target, [*prompts, chat_prompt], MAX_NEW_TOKENS)
    assert margin > MIN_MARGIN, f"the reference has a near-tie (gap {margin:.2e})"
    sequences = [p + o for p, o in zip([*prompts, chat_prompt], outputs, strict=True)]
    drafter = fit_drafter(target, sequences, work / "drafter")
    return World(target, drafter, prompts, chat_prompt)


@pytest.fixture(scope="module")
def served(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    """``brisk serve --model TARGET --drafter DIR --device cpu``, the command a user runs,
    stopped by its process group whatever the tests do."""
    work = tmp_path_factory.mktemp("drafter_server")
    flags = ["--device", "cpu", "--drafter", str(world.drafter)]
    process, server = start_brisk_serve(work, world.target, flags, ["--max-running-requests", "16"])
    try:
        yield server
    finally:
        process.stop()


def brisk_loop(world: World, prompts: list[list[int]], eos: bool = False) -> list[Any]:
    """brisk's speculative decoding of ``prompts`` with the world's drafter, greedy."""
    import torch
    from transformers import AutoModelForCausalLM

    from brisk.runtime.drafter import SDOptions, load_drafter, speculative_decode

    target = AutoModelForCausalLM.from_pretrained(world.target, dtype=torch.float32).eval()
    eos_id = target.config.eos_token_id if eos else None
    options = SDOptions(max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eos_id)
    return speculative_decode(target, load_drafter(world.drafter), prompts, options).outputs


def until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def test_generate_is_the_targets_greedy_decoding_with_brisks_rounds(
    world: World, served: RealServer
) -> None:
    """Token ids in, token ids out: every answer is the target's greedy decoding, and the server
    ran brisk's loop's rounds (verify forwards, accepted drafts), partial and full acceptance
    among them."""
    want, _ = greedy_reference(world.target, world.prompts, MAX_NEW_TOKENS)
    loop = brisk_loop(world, world.prompts)
    lengths = [L for out in loop for L in out.accept_lengths]
    assert max(lengths) == BLOCK - 1, "the test needs rounds that accept the whole block"
    assert min(lengths) == 0, "the test needs rounds that reject the first draft"
    body = {
        "input_ids": world.prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True},
    }
    answers = post_json(served.url, "/generate", body)
    for i, (tokens, out, answer) in enumerate(zip(want, loop, answers, strict=True)):
        meta = answer["meta_info"]
        assert answer["output_ids"] == tokens == out.tokens, f"prompt {i}"
        assert meta["spec_verify_ct"] + 1 == out.target_forwards, f"prompt {i}: forwards"
        assert meta["spec_num_correct_drafts"] == sum(out.accept_lengths), f"prompt {i}"


def test_text_completions_and_chat_are_the_targets_greedy_decoding(
    world: World, served: RealServer
) -> None:
    """Text in, text out, through ``/generate``, ``/v1/completions`` (the OpenAI client) and
    ``/v1/chat/completions`` (the ChatML template): the target's greedy tokens to its EOS."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world.target)
    eos = tokenizer.eos_token_id
    prompts = [*world.prompts, world.chat_prompt]
    want = [until_eos(t, eos) for t in greedy_reference(world.target, prompts, MAX_NEW_TOKENS)[0]]
    texts = [tokenizer.decode(t, skip_special_tokens=True) for t in want]
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS}
    answers = post_json(served.url, "/generate", {"text": TEXTS, "sampling_params": params})
    for i, answer in enumerate(answers):
        assert answer["meta_info"]["prompt_tokens"] == len(world.prompts[i]), f"prompt {i}"
        assert answer["output_ids"] == want[i], f"prompt {i}"
        assert answer["text"] == texts[i], f"prompt {i}"
    client = OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=60)
    model = client.models.list().data[0].id
    for i, text in enumerate(TEXTS[:3]):
        got = client.completions.create(
            model=model, prompt=text, max_tokens=MAX_NEW_TOKENS, temperature=0
        )
        assert got.choices[0].text == texts[i], f"prompt {i}"
        assert got.usage.completion_tokens == len(want[i]), f"prompt {i}"
    chat = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=MAX_NEW_TOKENS, temperature=0
    )
    assert chat.usage.prompt_tokens == len(world.chat_prompt)
    assert chat.choices[0].message.content == texts[-1]
    assert chat.usage.completion_tokens == len(want[-1])


def test_concurrent_requests_are_each_the_targets_greedy_decoding(
    world: World, served: RealServer
) -> None:
    """Requests arriving together batch in the server's rounds (drafter contexts of different
    lengths padded together); each answer is still its own greedy decoding."""
    want, _ = greedy_reference(world.target, world.prompts, MAX_NEW_TOKENS)

    def one(prompt: list[int]) -> list[int]:
        params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
        body = {"input_ids": prompt, "sampling_params": params}
        return list(post_json(served.url, "/generate", body)["output_ids"])

    with ThreadPoolExecutor(len(world.prompts)) as pool:
        got = list(pool.map(one, world.prompts * 2))
    assert got == want * 2


def test_a_request_for_another_temperature_is_refused(served: RealServer) -> None:
    """A greedy server serves greedy requests only: a sampled one is refused with the reason."""
    params = {"temperature": 0.7, "max_new_tokens": 4}
    with pytest.raises(urllib.error.HTTPError) as refused:
        post_json(served.url, "/generate", {"text": TEXTS[0], "sampling_params": params})
    assert refused.value.code == 400
    assert "temperature: BRISK_DRAFTER serves greedy" in refused.value.read().decode()


def test_fuzzed_requests_are_answered_or_refused_naming_the_field(
    world: World, served: RealServer
) -> None:
    """The request fuzzer (:mod:`tests.serving.fuzz`, short form) against the served drafter:
    a 200 that parses or a 4xx naming a field for every body, ``/health`` after every ten, and
    a greedy request afterwards still the target's greedy decoding."""
    from transformers import AutoConfig

    from tests.serving.fuzz import fuzz

    vocab = AutoConfig.from_pretrained(world.target).vocab_size
    tally = fuzz(served.url, vocab, str(world.target), requests=120, seed=1, budget_s=50.0)
    assert tally.failures == [], "\n".join(tally.failures[:10])
    assert tally.requests >= 30, tally.to_dict()
    assert tally.statuses[200] > 0, tally.to_dict()
    assert tally.statuses[400] > 0, tally.to_dict()
    want, _ = greedy_reference(world.target, world.prompts[:1], MAX_NEW_TOKENS)
    params = {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    body = {"input_ids": world.prompts[0], "sampling_params": params}
    assert post_json(served.url, "/generate", body)["output_ids"] == want[0]
    assert "Scheduler hit an exception" not in served.log.read_text()


def test_a_drafter_for_another_target_is_refused_in_one_line(world: World, tmp_path: Path) -> None:
    """Before SGLang starts: ``brisk serve`` exits 2 with one line naming the mismatch (here the
    drafter's depth: built for a 6-layer target), and no server process is left."""
    import json

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in world.drafter.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "num_target_layers": 6}))
    port = free_port()
    serve = ["serve", "--model", str(world.target), "--drafter", str(bad), "--device", "cpu"]
    run = subprocess.run(
        [sys.executable, "-m", "brisk.cli", *serve, "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines == ["brisk: error: --drafter: built for a target of 6 layers, the target has 4"], (
        run.stderr
    )


def test_the_dry_run_prints_the_drafters_algorithm_and_block(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import shlex

    from brisk.cli import main

    def plugin_config(line: str) -> object:
        """The options the dry run hands SGLang: the model config's ``brisk`` key."""
        words = shlex.split(line)
        assert not [w for w in words if w.startswith("BRISK_") and "=" in w]
        return json.loads(words[words.index(OVERRIDE_FLAG) + 1])["brisk"]

    serve = ["serve", "--model", str(world.target), "--drafter", str(world.drafter)]
    assert main([*serve, "--device", "cpu", "--dry-run"]) == 0
    line = capsys.readouterr().out
    assert plugin_config(line) == {"drafter": str(world.drafter.resolve())}
    want = f"--speculative-algorithm BRISK_DRAFTER --speculative-num-draft-tokens {BLOCK}"
    assert want in line
    assert "--disable-radix-cache" in line
    sampled = ["--temperature", "1", "--top-k", "8", "--seed", "3"]
    assert main([*serve, *sampled, "--device", "cpu", "--dry-run"]) == 0
    drafter = str(world.drafter.resolve())
    options = {"drafter": drafter, "seed": 3, "temperature": 1.0, "top_k": 8}
    assert plugin_config(capsys.readouterr().out) == options


def test_options_and_a_drafter_beside_isd_are_refused_in_one_line(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from brisk.cli import main
    from brisk.runtime.serving.drafter_options import BriskDrafterOptions
    from brisk.runtime.serving.options import OptionError

    with pytest.raises(OptionError, match=r"^tmperature: unknown BRISK_DRAFTER option"):
        BriskDrafterOptions.from_mapping({"drafter": str(world.drafter), "tmperature": 0})
    with pytest.raises(OptionError, match=r"^drafter: BRISK_DRAFTER needs a drafter"):
        BriskDrafterOptions.from_mapping({"temperature": 0})
    with pytest.raises(OptionError, match=r"^drafter: .* holds no drafter checkpoint"):
        BriskDrafterOptions.from_mapping({"drafter": str(world.target / "nowhere")})
    serve = ["serve", "--model", str(world.target), "--drafter", str(world.drafter)]
    for flags, why in (
        (
            ["--stride", "4"],
            "--drafter: a server decodes with ISD (--stride) or a drafter, not both",
        ),
        (
            ["--corrector", "x"],
            "--corrector: an ISD option; with --drafter only --temperature, --top-k and --seed "
            "apply",
        ),
        (
            ["--top-k", "0"],
            "--top-k: need an integer K ≥ 1 (candidates per MASK position), got 0 (0 does not "
            "mean 'no limit' here: drafts at T > 0 are drawn from q restricted to its Top-K, so "
            "pass the vocabulary size for untruncated drafts)",
        ),
    ):
        assert main([*serve, *flags, "--device", "cpu", "--dry-run"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"brisk: error: {why}"]


def test_sampling_is_brisks_loop_with_the_same_seeds_and_keys(world: World, tmp_path: Path) -> None:
    """A T = 1 server (Top-K drafts): a request's tokens are a function of its prompt, seed and
    id, the same batched and alone, and brisk's loop with the same seeds and request keys
    (:func:`~brisk.runtime.serving.common.request_key` of the rids) draws the same tokens."""
    from brisk.runtime.serving.common import request_key

    prompts, seeds = world.prompts[:4], [11, 12, 13, 14]
    rids = [f"sampled-{i}" for i in range(len(prompts))]

    def body(prompts: list[list[int]], seeds: list[int], rids: list[str]) -> dict[str, object]:
        params = [
            {"temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
            | {"sampling_seed": s}
            for s in seeds
        ]
        return {"input_ids": prompts, "sampling_params": params, "rid": rids}

    options = {"drafter": str(world.drafter), "temperature": 1.0, "top_k": 8}
    # SGLang's warm-up asks for 8 greedy tokens, which a T = 1 server refuses
    process, server = start_real_server(
        tmp_path, ["--skip-server-warmup"], model=world.target, drafter=options
    )
    try:
        answers = post_json(server.url, "/generate", body(prompts, seeds, rids))
        together = [a["output_ids"] for a in answers]
        alone = [
            post_json(server.url, "/generate", body([p], [s], [r]))[0]["output_ids"]
            for p, s, r in zip(prompts, seeds, rids, strict=True)
        ]
    finally:
        process.stop()
    assert together == alone
    greedy, _ = greedy_reference(world.target, prompts, MAX_NEW_TOKENS)
    assert together != greedy, "T = 1 sampled exactly the greedy tokens: sampling is not on"
    import torch
    from transformers import AutoModelForCausalLM

    from brisk.runtime.drafter import SDOptions, load_drafter, speculative_decode

    target = AutoModelForCausalLM.from_pretrained(world.target, dtype=torch.float32).eval()
    sd = SDOptions(temperature=1.0, draft="top-k", top_k=8, max_new_tokens=MAX_NEW_TOKENS)
    loop = speculative_decode(
        target,
        load_drafter(world.drafter),
        prompts,
        sd,
        seeds=seeds,
        request_ids=[request_key(r) for r in rids],
    )
    assert [o.tokens for o in loop.outputs] == together


def test_sglang_launched_directly_refuses_a_verify_width_other_than_the_block(
    world: World, tmp_path: Path
) -> None:
    """The plugin's own check, for SGLang launched without ``brisk serve``: it refuses while
    SGLang resolves its arguments, before the model loads."""
    launch = server_launch(
        world.target,
        free_port(),
        device="cpu",
        drafter={"drafter": str(world.drafter)},
        extra_args=["--speculative-num-draft-tokens", "5"],
    )
    server = ServerProcess(launch, tmp_path / "log").start()
    try:
        with pytest.raises(RuntimeError, match="the server exited") as failed:
            server.wait_ready(timeout=240)
    finally:
        server.stop()
    want = (
        f"--speculative-num-draft-tokens: the drafter's block is {BLOCK} slots "
        f"([pending, {BLOCK - 1} drafts]), got 5"
    )
    assert want in str(failed.value)


def test_the_speed_report_reads_the_servers_answers_beside_brisks_loop(
    world: World, served: RealServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``brisk bench requests`` against the served drafter, ``brisk decode --drafter`` and
    ``--plain`` on the same prompt file, then ``brisk bench speed``: every greedy answer is
    plain decoding's, and the server's tokens per verify are brisk's loop's (same rounds)."""
    import json

    from transformers import AutoTokenizer

    from brisk.cli import main

    # the chat turn opens with <|im_start|>, the BOS: encoded as the drafter was fitted to it
    chat = AutoTokenizer.from_pretrained(world.target).apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    texts = [*TEXTS, chat]
    categories = ["code", "code", "text", "code", "code", "code", "chat"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": i, "prompt": t, "category": c}) + "\n"
            for i, (t, c) in enumerate(zip(texts, categories, strict=True))
        )
    )
    budget = ["--max-new-tokens", str(MAX_NEW_TOKENS)]
    server, loop, plain = (tmp_path / f"{n}.jsonl" for n in ("server", "loop", "plain"))
    assert main(["bench", "requests", "--url", served.url, "--tokenizer", str(world.target),
                 "--prompts", str(prompts), "--out", str(server), *budget]) == 0  # fmt: skip
    decode = ["decode", "--model", str(world.target), "--prompts", str(prompts), *budget]
    assert main([*decode, "--drafter", str(world.drafter), "--out", str(loop)]) == 0
    assert main([*decode, "--plain", "--out", str(plain)]) == 0
    out = tmp_path / "report"
    runs = ["--run", f"server={server}", "--run", f"loop={loop}"]
    assert main(["bench", "speed", "--baseline", str(plain), *runs, "--out", str(out)]) == 0
    rows = {
        (r["method"], r["category"]): r
        for r in json.loads((out / "speed.json").read_text())["rows"]
    }
    for (method, category), row in rows.items():
        assert row["equal"] == row["requests"], (method, category)
    for category in ("code", "text", "chat", "all"):
        assert rows["server", category]["tau"] == rows["loop", category]["tau"], category
    assert rows["server", "chat"]["tau"] > 1  # the prompt the drafter was fitted to
    answers = [json.loads(line) for line in server.read_text().splitlines()]
    assert all(a["finished"] in ("eos", "length") for a in answers)
    assert "| server | all | 7 |" in capsys.readouterr().out
