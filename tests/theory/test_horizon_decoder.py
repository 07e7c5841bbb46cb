"""The state machine of brisk.theory.horizon is the decoder's: replaying each request's accept
lengths through it (the prefill commits the first token and counts as a forward) reproduces the
request's forwards and committed counters exactly (batched decoding, EOS and token-budget stops,
greedy and sampled, with and without the corrector)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector, CorrectorConfig
from brisk.runtime.isd import ISDOptions, decode

V, MASK = 12, 11


def replay(accept_lengths: list[int], n: int, M: int) -> tuple[int, int, int]:
    """(forwards, verify rounds, committed) of a response of n tokens under the module's rules:
    the prefill is a forward and commits the first token, then a cold start; a cold start
    commits 1 token; a verify round with accept length L commits L + 1 and stays warm iff
    L = M; the run stops once ≥ n tokens are committed."""
    committed = forwards = 1  # the prefill
    rounds = 0
    verify = False
    while committed < n:
        forwards += 1
        if verify:
            L = accept_lengths[rounds]
            rounds += 1
            committed += L + 1
            verify = L == M
        else:
            committed += 1
            verify = True
    return forwards, rounds, committed


@pytest.fixture(scope="module")
def backbone() -> HFBackbone:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # peaked enough that some blocks are accepted whole
    return HFBackbone(model, mask_token_id=MASK)


@pytest.mark.parametrize(
    ("stride", "temperature", "eos", "head"),
    [
        pytest.param(4, 1.0, 0, False, id="N4-sampled-eos"),
        pytest.param(8, 1.0, None, False, id="N8-sampled-budget"),
        pytest.param(4, 0.0, 5, False, id="N4-greedy-eos"),
        pytest.param(3, 0.7, 0, True, id="N3-head-eos"),
    ],
)
def test_replayed_accept_lengths_reproduce_the_decoders_counters(
    backbone: HFBackbone, stride: int, temperature: float, eos: int | None, head: bool
) -> None:
    M = stride - 1
    g = torch.Generator().manual_seed(stride)
    prompts = [torch.randint(1, MASK, (3,), generator=g).tolist() for _ in range(24)]
    corrector = None
    if head:
        torch.manual_seed(5)
        corrector = Corrector(CorrectorConfig.small(32, V, M=M, K=4))
    options = ISDOptions(
        stride=stride, temperature=temperature, max_new_tokens=30, eos_token_id=eos
    )
    out = decode(backbone, prompts, options, corrector=corrector, batch_size=8)
    lengths = [L for r in out.requests for L in r.accept_lengths]
    assert M in lengths  # both kinds of verify round get replayed: full acceptances
    assert min(lengths) < M  # and rejections
    for r in out.requests:
        forwards, rounds, committed = replay(r.accept_lengths, len(r.tokens), M)
        assert (forwards, rounds, committed) == (r.forwards, len(r.accept_lengths), r.committed)
