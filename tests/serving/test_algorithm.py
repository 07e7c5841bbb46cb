"""``BriskISD.run`` through SGLang's algorithm interface equals brisk's reference ISD, token for
token: greedy and sampled (same seeds and request keys), head off, head on and in shadow, with
requests joining at different forwards so batches mix fresh and carried rows
(``harness.serve``). And the DFlash hook fires: the corrector, not DFlash's argmax, drafts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from brisk.runtime.isd import ISDOptions, reference_decode
from brisk.runtime.serving.algorithm import request_key
from tests.runtime.test_isd import MASK, micro_backbone, random_corrector
from tests.serving.harness import serve

pytestmark = pytest.mark.usefixtures("plugins")

PROMPTS = [[1, 4, 2], [7], [3, 3, 9, 0, 5], [2, 8], [6, 1, 1, 4], [10, 2, 7]]
SEEDS = [0, 1, 2, 3, 4, 1]
KEYS = [11, 12, 13, 14, 15, 16]
MAX_NEW = 40


def algorithm(tmp_path: Path, **options: object) -> object:
    from sglang.srt.dllm.algorithm import get_algorithm
    from sglang.srt.dllm.config import DllmConfig

    stride = int(options.get("stride", 4))  # type: ignore[call-overload]
    config = DllmConfig(algorithm="BriskISD", algorithm_config=options, block_size=2 * stride - 1,
                        mask_id=MASK, max_running_requests=8)  # fmt: skip
    return get_algorithm(config)


@pytest.mark.parametrize("stride", [3, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("head", ["off", "on", "shadow"])
def test_run_equals_reference_isd(
    tmp_path: Path, stride: int, temperature: float, head: str
) -> None:
    backbone = micro_backbone()
    options: dict[str, object] = {"stride": stride, "temperature": temperature, "top_k": 6}
    corrector = None
    if head != "off":
        corrector = random_corrector(stride - 1, 6)
        corrector.save_pretrained(tmp_path / "head")
        options = {
            "stride": stride,
            "temperature": temperature,
            "corrector": str(tmp_path / "head"),
            "impl": "naive",
            "shadow": head == "shadow",
        }
    algo = algorithm(tmp_path, **options)
    # batches change every forward: requests join, leave, and (sampled) come in a new order
    served = serve(algo, backbone, PROMPTS, SEEDS, KEYS, MAX_NEW, shuffle=temperature > 0)
    isd = ISDOptions(stride=stride, temperature=temperature, max_new_tokens=MAX_NEW, top_k=6)
    head_on = corrector if head == "on" else None
    for r, prompt in enumerate(PROMPTS):
        ref = reference_decode(backbone, prompt, isd, corrector=head_on, seed=SEEDS[r],
                               request_id=request_key(f"req-{KEYS[r]}"))  # fmt: skip
        assert served[r] == ref.tokens, f"request {r}"
    assert algo.tokens / algo.forwards > 1.0  # the server's TPF counters: ISD commits > 1/forward


def test_an_unchanged_batch_carries_its_state_without_copies(tmp_path: Path) -> None:
    from brisk.runtime.serving.algorithm import RowHandle
    from tests.serving.harness import ContractRunner

    backbone = micro_backbone()
    algo = algorithm(tmp_path, stride=4, temperature=1.0, top_k=6)
    runner = ContractRunner(backbone)
    for r, p in enumerate(PROMPTS[:3]):
        runner.prefill(r, p)
    runner.rows = [0, 1, 2]

    def batch(states: list) -> SimpleNamespace:
        ids = torch.full((3, algo.block_size), MASK)
        ids[:, 0] = torch.tensor([p[-1] for p in PROMPTS[:3]])
        return SimpleNamespace(batch_size=3, input_ids=ids.flatten(), sampling_info=None,
                               rids=["a", "b", "c"])  # fmt: skip

    *_, handles, _ = algo.run(runner, batch([None] * 3), None)
    assert all(isinstance(h, RowHandle) and h.batch is handles[0].batch for h in handles)
    assert algo._gather(batch(handles), handles, None) is handles[0].batch
    swapped = [handles[1], handles[0], handles[2]]
    gathered = algo._gather(batch(swapped), swapped, None)
    keys = [request_key(r) for r in "bac"]
    assert gathered.request.tolist() == keys


def test_request_keys_separate_requests_with_one_seed(tmp_path: Path) -> None:
    """Two requests with the same prompt and seed but other keys draw other uniforms."""
    backbone = micro_backbone()
    algo = algorithm(tmp_path, stride=4, temperature=1.0, top_k=6)
    a, b = serve(algo, backbone, [[1, 4], [1, 4]], [0, 0], [1, 2], 60)
    assert a != b


def test_block_logs_from_the_server_feed_the_mechanism_report(tmp_path: Path) -> None:
    from brisk.mechanism.io import read_blocks
    from brisk.mechanism.report import analyze, write_report

    backbone = micro_backbone()
    corrector = random_corrector(3, 6)
    corrector.save_pretrained(tmp_path / "head")
    algo = algorithm(tmp_path, stride=4, temperature=1.0, corrector=str(tmp_path / "head"),
                     shadow=True, impl="naive", log_blocks=str(tmp_path / "blocks"))  # fmt: skip
    served = serve(algo, backbone, PROMPTS, SEEDS, KEYS, MAX_NEW, shuffle=True)
    algo.close()
    batches = list(read_blocks(tmp_path / "blocks", check=True))  # the schema's own checks
    requests = {int(r) for b in batches for r in b.columns["request_id"]}
    # the logged rows are the decode's own: accepted prefixes agree with the output
    isd = ISDOptions(stride=4, temperature=1.0, max_new_tokens=MAX_NEW, top_k=6)
    for r, prompt in enumerate(PROMPTS):
        ref = reference_decode(backbone, prompt, isd, seed=SEEDS[r],
                               request_id=request_key(f"req-{KEYS[r]}"))  # fmt: skip
        assert served[r] == ref.tokens
        key = request_key(f"req-{KEYS[r]}")
        logged = [
            int(a)
            for b in batches
            for a, q in zip(b.columns["accept_len"], b.columns["request_id"], strict=True)
            if q == key
        ]
        assert logged == ref.accept_lengths[: len(logged)]
    head_choice = [b.columns["head_choice"] for b in batches]
    assert requests == {request_key(f"req-{k}") for k in KEYS}
    assert sum(b.rows for b in batches) > len(PROMPTS)
    assert all((h >= 0).all() for h in head_choice)  # shadow: the head ran beside the base
    summary = analyze(tmp_path / "blocks", draws=50)
    assert (tmp_path / "report" / "summary.md") in write_report(summary, tmp_path / "report")


def test_the_dflash_hook_fires() -> None:
    """The patched sampler returns the corrector's block over the Top-K of the draft logits;
    without a corrector it is DFlash's own argmax."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from brisk.runtime.serving.algorithm import ModelHeads

    backbone = micro_backbone()
    head = random_corrector(3, 6)
    model = backbone.model
    bs, block, H = 5, 4, 32
    torch.manual_seed(3)
    hidden = torch.randn(bs * (block - 1), H)
    anchors = torch.randint(0, MASK, (bs, block))
    worker = SimpleNamespace(
        block_size=block,
        _draft_block_ids_buf=anchors,
        brisk_corrector=None,
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)),
    )
    sample = DFlashWorkerV2._greedy_sample_from_vocab_parallel_head
    assert sample.__wrapped__ is not None
    with torch.no_grad():
        own = sample(worker, hidden_states=hidden, lm_head=model.lm_head)
        assert torch.equal(own, (hidden @ model.lm_head.weight.T).argmax(-1))
        worker.brisk_corrector = head
        reranked = sample(worker, hidden_states=hidden, lm_head=model.lm_head)
        mask_hidden = hidden.view(bs, block - 1, H)
        cand_logits, cand_ids = (mask_hidden @ model.lm_head.weight.T).topk(6, dim=-1)
        expected = head.select(ModelHeads(model), torch.zeros(bs, H), anchors[:, 0], mask_hidden,
                               cand_logits, cand_ids, 0.0).tokens.reshape(-1)  # fmt: skip
    assert torch.equal(reranked, expected)
    assert not torch.equal(reranked, own)  # the head changed some drafts
    assert DFlashWorkerV2._maybe_build_draft_sampler(worker) is None  # eager while reranking
