"""Training the block drafter: the training forward is the inference forward, the weightings
are the theory's, and training on the target's own greedy outputs raises acceptance.

- Every block of a training batch (many anchors, one forward, a block-attention mask) gives
  the logits the inference loop's forward gives for that block alone (context before the
  anchor, then the block), to 1e-5.
- The mask: a query sees exactly the context before its anchor and its own block.
- The weights: uniform, DFlash's decay, D-PACE's from the drafter's token probabilities, and
  BRISK's from the tracked profile under the speculative cost model, as ``brisk.theory``
  computes them.
- A drafter trained for 150 steps on the target's greedy continuations is accepted more often
  by greedy speculative decoding than the untrained one, on prompts it was not trained on.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brisk.runtime.drafter import SDOptions, speculative_decode
from brisk.runtime.drafter.speculative import _Context
from brisk.runtime.train.drafter.loss import (
    block_attention,
    drafter_loss,
    make_blocks,
    sample_anchors,
    weights_for,
)
from brisk.theory import (
    AcceptanceProfile,
    CostModel,
    ProfileTracker,
    decay_weights,
    dpace_weights,
    progress_weights,
)
from tests.runtime.test_drafter import greedy_reference, tiny_drafter, tiny_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_block_mask_shows_the_context_before_the_anchor_and_the_own_block() -> None:
    anchors, keep = torch.tensor([[1, 3]]), torch.tensor([[True, True]])
    mask = block_attention(anchors, keep, S=5, block=2)[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 1, 1],
        [1, 1, 1, 0, 0, 0, 0, 1, 1],
    ]


def test_anchors_are_supervised_with_a_supervised_successor_and_sorted() -> None:
    supervised = torch.tensor([[False, True, True, True, False, True], [False] * 4 + [True] * 2])
    g = torch.Generator().manual_seed(0)
    anchors, keep = sample_anchors(supervised, 8, g)
    assert anchors[0][keep[0]].tolist() == [1, 2]
    assert anchors[1][keep[1]].tolist() == [4]
    with pytest.raises(ValueError, match="no sequence has two consecutive supervised"):
        sample_anchors(torch.tensor([[True, False, True]]), 4)


def test_the_training_forward_is_the_inference_forward() -> None:
    target = tiny_target(6, scale=1.0)
    drafter = tiny_drafter(target, 4)
    M = drafter.spec.M
    torch.manual_seed(3)
    ids = torch.randint(0, 5, (2, 12))
    supervised = torch.ones_like(ids, dtype=torch.bool)
    anchors, keep = sample_anchors(supervised, 5, torch.Generator().manual_seed(1))
    blocks = make_blocks(ids, supervised, anchors, keep, M, drafter.spec.mask_token_id)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
        features = drafter.features(hs)
        positions = torch.arange(12).expand(2, 12)
        context = drafter.context_kv(drafter.project(features), positions)
        embeds = target.get_input_embeddings()(blocks.ids)
        mask = block_attention(anchors, keep, 12, M + 1)
        together = drafter(embeds, blocks.positions, context, mask).view(2, -1, M + 1, 32)
        for b in range(2):
            for j, a in enumerate(anchors[b].tolist()):
                alone = _Context(drafter)
                alone.append(features[b : b + 1, :a], 0)
                block = blocks.ids[b : b + 1].view(1, -1, M + 1)[:, j]
                assert alone.kv is not None
                h = drafter(
                    target.get_input_embeddings()(block),
                    torch.arange(a, a + M + 1)[None],
                    alone.kv,
                )
                torch.testing.assert_close(together[b, j], h[0], atol=1e-5, rtol=1e-5)


def test_the_weights_are_the_theorys() -> None:
    M = 5
    np.testing.assert_allclose(weights_for("uniform", M).numpy(), np.ones(M))
    np.testing.assert_allclose(weights_for("decay", M).numpy(), decay_weights(M, 7.0))
    q = torch.tensor([[0.9, 0.5, 0.2, 0.7, 0.1]], dtype=torch.float64)
    np.testing.assert_allclose(
        weights_for("dpace", M, token_probs=q).numpy(), dpace_weights(q.numpy(), 0.5)
    )
    tracker = ProfileTracker(M, decay=0.9)
    tracker.update(AcceptanceProfile.from_accept_lengths(np.array([0, 1, 5, 2, 0]), M))
    expected = progress_weights(tracker.posterior_mean(), CostModel.speculative(M))
    np.testing.assert_allclose(weights_for("brisk", M, tracker=tracker).numpy(), expected)
    assert weights_for("brisk", M, tracker=tracker).mean().item() == pytest.approx(1.0)


@pytest.mark.parametrize("weighting", ["brisk", "dpace", "decay", "uniform"])
def test_training_on_the_targets_outputs_raises_acceptance(weighting: str) -> None:
    target = tiny_target(6, scale=3.0)
    for p in target.parameters():
        p.requires_grad_(False)
    drafter = tiny_drafter(target, 4)
    rng = np.random.default_rng(0)
    train_prompts = [rng.integers(0, 5, 3).tolist() for _ in range(32)]
    seqs = [p + greedy_reference(target, p, 24) for p in train_prompts]
    ids = torch.tensor(seqs)
    supervised = torch.zeros_like(ids, dtype=torch.bool)
    supervised[:, 3:] = True
    test_prompts = [rng.integers(0, 5, 3).tolist() for _ in range(6)]
    options = SDOptions(max_new_tokens=30)
    before = speculative_decode(target, drafter, test_prompts, options).mean_accept
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    tracker = ProfileTracker(drafter.spec.M, decay=0.9)
    g = torch.Generator().manual_seed(0)
    drafter.train()
    first = None
    for _ in range(150):
        batch = torch.from_numpy(rng.choice(len(seqs), 8, replace=False))
        out = drafter_loss(
            target,
            drafter,
            ids[batch],
            supervised[batch],
            weighting,  # type: ignore[arg-type]
            anchors=8,
            tracker=tracker,
            generator=g,
        )
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        first = first if first is not None else float(out.ce.mean())
    drafter.eval()
    assert float(out.ce.mean()) < first
    after = speculative_decode(target, drafter, test_prompts, options).mean_accept
    assert after > before + 0.5, (before, after)
