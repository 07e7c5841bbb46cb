"""Corrector training: eq. 6 against an independent computation, the reached-position mask, the
event store's checks, and a head trained on a micro world that beats head-off decoding."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from brisk.runtime.backbone import HFBackbone
from brisk.runtime.corrector import Corrector
from brisk.runtime.isd import DecodeResult
from brisk.runtime.train.corrector.config import CollectOptions, CorrectorTrainConfig
from brisk.runtime.train.corrector.events import collect_from_checkpoint
from brisk.runtime.train.corrector.recipe import event_batch, head_loss, train_corrector
from brisk.runtime.train.corrector.store import EventStore
from tests.runtime.conftest import micro_prompts

MICRO_COLLECT = CollectOptions(problems=60, samples=5, stride=4, top_k=8, max_new_tokens=24)


def eq6_by_hand(refined, target, q, mask, beta):  # type: ignore[no-untyped-def]
    """Σ m (CE(p, r) + β KL(q ‖ r)) / Σ m, one position at a time, in float64."""
    total, n = 0.0, 0
    B, M, K = refined.shape
    for e in range(B):
        for j in range(M):
            if not mask[e, j]:
                continue
            z = [float(v) for v in refined[e, j]]
            top = max(z)
            log_r = [v - top - math.log(sum(math.exp(w - top) for w in z)) for v in z]
            ce = -sum(float(target[e, j, k]) * log_r[k] for k in range(K))
            kl = sum(
                float(q[e, j, k]) * (math.log(float(q[e, j, k])) - log_r[k])
                for k in range(K)
                if q[e, j, k] > 0
            )
            total += ce + beta * kl
            n += 1
    return total / n


def hand_batch(seed: int = 0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    B, M, K = 4, 5, 6
    refined = torch.randn(B, M, K, generator=g) * 2
    target = torch.softmax(torch.randn(B, M, K, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(B, M, K, generator=g) * 3, -1)
    q[0, 0, 3] = 0.0  # a zero-probability candidate: 0 log 0 = 0
    q[0, 0] /= q[0, 0].sum()
    accept_len = torch.tensor([0, 2, 5, 3])  # L = M: all-pass, every position reached
    mask = torch.arange(M)[None] <= accept_len[:, None]
    return refined, target, q, mask


@pytest.mark.parametrize("beta", [0.0, 0.01, 0.7])
def test_loss_equals_eq6_computed_by_hand(beta: float) -> None:
    refined, target, q, mask = hand_batch()
    out = head_loss(refined, target, q, mask, beta)
    assert out.positions == int(mask.sum()) == 1 + 3 + 5 + 4
    assert float(out.loss) == pytest.approx(eq6_by_hand(refined, target, q, mask, beta), rel=1e-5)


def test_one_global_mean_not_a_mean_of_event_means() -> None:
    refined, target, q, mask = hand_batch(1)
    out = head_loss(refined, target, q, mask, 0.01)
    per_event = [
        eq6_by_hand(refined[e : e + 1], target[e : e + 1], q[e : e + 1], mask[e : e + 1], 0.01)
        for e in range(len(mask))
    ]
    assert abs(float(out.loss) - float(np.mean(per_event))) > 1e-3  # the two differ here
    assert float(out.loss - 0.01 * out.kl) == pytest.approx(float(out.ce), rel=1e-6)


def test_positions_after_the_first_rejection_get_no_gradient() -> None:
    refined, target, q, mask = hand_batch(2)
    # what sits beyond the first rejection must not matter, even garbage
    target = torch.where(mask[..., None], target, torch.full_like(target, 1e6))
    refined.requires_grad_(True)
    head_loss(refined, target, q, mask, 0.01).loss.backward()
    assert refined.grad is not None
    assert torch.all(refined.grad[~mask] == 0)
    assert torch.all(refined.grad[mask].abs().sum(-1) > 0)


# -- on a micro world -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_events(micro_base: Path, tmp_path_factory: pytest.TempPathFactory) -> EventStore:
    out = tmp_path_factory.mktemp("events") / "store"
    return collect_from_checkpoint(micro_base, out, MICRO_COLLECT, show_progress=False)


def test_the_store_holds_what_the_head_needs(micro_events: EventStore) -> None:
    s = micro_events
    n, M, K = len(s), s.M, s.K
    assert (M, K) == (3, 8)
    assert n > 100
    assert s.mask_hidden.shape == (n, M, s.hidden_size)
    assert s.anchor_hidden.shape == (n, s.hidden_size)
    assert isinstance(s.mask_hidden, np.memmap)
    logits = np.asarray(s.cand_logits)
    assert np.all(np.diff(logits, axis=-1) <= 0)  # candidates by base logit, descending
    # q over C in the log is the softmax of the stored logits, up to the full-vocab normalizer
    q_c = s.q / s.q.sum(-1, keepdims=True)
    sm = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(q_c, sm / sm.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
    reached = np.arange(M)[None] <= s.accept_len[:, None]
    assert np.all(np.isfinite(s.p[reached]))
    assert np.all(np.isnan(s.p[~reached]))


def test_the_batch_mask_is_the_accepted_prefix_and_the_first_rejection(
    micro_events: EventStore,
) -> None:
    s = micro_events
    idx = np.arange(len(s))
    for K in (2, 8):
        b = event_batch(s, idx, K)
        reached = np.arange(s.M)[None] <= s.accept_len[:, None]
        mass = np.nansum(s.p[:, :, :K], -1)
        np.testing.assert_array_equal(b.mask.numpy(), reached & (mass > 0))
        t = b.target.numpy()
        np.testing.assert_allclose(t.sum(-1)[b.mask.numpy()], 1.0, rtol=1e-5)
        assert np.all(t[~b.mask.numpy()] == 0)
        tokens = np.take_along_axis(s.cand_ids, s.base_choice[..., None], -1)[..., 0]
        np.testing.assert_array_equal(b.tokens.numpy(), tokens)  # the base's own block
    hard = event_batch(s, idx, 8, target="top1").target.numpy()
    assert set(np.unique(hard.sum(-1))) <= {0.0, 1.0}


def test_a_trained_head_lowers_held_out_loss_and_lengthens_accepted_prefixes(
    micro_head: tuple[HFBackbone, Corrector, EventStore],
) -> None:
    """The micro world of test_isd (a random peaked Qwen3, V = 12, stride 4, T = 1): the head
    trained on its events (conftest) against head-off decoding on 200 other prompts with the same
    decode seeds. Held-out loss must fall by a third and E[L] rise (deterministic given seeds)."""
    from brisk.runtime.isd import ISDOptions, decode

    backbone, head, store = micro_head
    records = [json.loads(x) for x in (store.path.parent / "head" / "metrics.jsonl").open()]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert records[0]["event"] == "start"
    assert records[1]["event"] == "eval"
    assert records[1]["step"] == 0  # the untrained head's held-out loss
    assert val[-1] < 2 / 3 * val[0], val
    assert any("ce" in r and "kl" in r for r in records)
    prompts = micro_prompts(200, seed=1)
    seeds = range(10**6, 10**6 + 200)
    options = ISDOptions(stride=4, temperature=1.0, max_new_tokens=16, top_k=4)
    off = decode(backbone, prompts, options, seeds=seeds, batch_size=200)
    on = decode(backbone, prompts, options, corrector=head, seeds=seeds, batch_size=200)

    def mean_L(result: DecodeResult) -> float:
        return float(np.mean([L for r in result.requests for L in r.accept_lengths]))

    assert mean_L(on) > 1.2 * mean_L(off), (mean_L(on), mean_L(off))


def test_evaluation_times_the_head(
    micro_base: Path, micro_events: EventStore, tmp_path: Path
) -> None:
    """A head trained on the tiny world's events loads with from_pretrained and decodes; its
    own time is measured apart from the rest."""
    from brisk.experiments.evaluate import Decoding, evaluate_checkpoint
    from brisk.runtime.train.base.config import BaseTrainConfig
    from brisk.worlds.arithmetic.task import make_split

    cfg = CorrectorTrainConfig(
        events=str(micro_events.path), out_dir=str(tmp_path / "head"), K=8, epochs=1, head="small"
    )
    result = train_corrector(cfg, show_progress=False, store=micro_events)
    head = Corrector.from_pretrained(result.checkpoint)
    assert head.config.K == 8
    assert head.config.M == 3
    task = BaseTrainConfig.load(micro_base / "train_config.json").task
    problems = make_split(task, "test", 10, 1)
    ev = evaluate_checkpoint(
        micro_base,
        [p.prompt for p in problems],
        [p.answer for p in problems],
        arm="x",
        seed=0,
        decoding=Decoding(stride=4, max_new_tokens=24),
        corrector=head,
    )
    assert ev.head_s > 0
    assert ev.tokens_per_s_net > ev.tokens_per_s


# -- bad input ----------------------------------------------------------------------------------


def _copy(store: EventStore, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(store.path, dst)
    return dst


def test_a_truncated_feature_file_is_refused(micro_events: EventStore, tmp_path: Path) -> None:
    path = _copy(micro_events, tmp_path)
    f = path / "features" / "mask_hidden.bin"
    f.write_bytes(f.read_bytes()[:-4])
    with pytest.raises(ValueError, match=r"mask_hidden\.bin: .* bytes, expected .*truncated"):
        EventStore.open(path)


def test_an_empty_store_is_refused(micro_events: EventStore, tmp_path: Path) -> None:
    path = _copy(micro_events, tmp_path)
    meta = json.loads((path / "_events.json").read_text())
    (path / "_events.json").write_text(json.dumps({**meta, "events": 0}))
    with pytest.raises(ValueError, match="holds no events"):
        EventStore.open(path)


def test_events_of_another_backbone_are_refused(micro_events: EventStore, tmp_path: Path) -> None:
    path = _copy(micro_events, tmp_path)
    meta = json.loads((path / "_events.json").read_text())
    (path / "_events.json").write_text(json.dumps({**meta, "hidden_size": meta["hidden_size"] * 2}))
    with pytest.raises(ValueError, match=r"anchor_hidden\.bin"):  # the sizes no longer fit
        EventStore.open(path)
    (path / "_events.json").write_text(json.dumps({**meta, "checkpoint_hash": "0" * 16}))
    cfg = CorrectorTrainConfig(events=str(path), out_dir=str(tmp_path / "out"), K=8)
    with pytest.raises(ValueError, match=r"is not the checkpoint .* was collected from"):
        train_corrector(cfg, show_progress=False)
    with pytest.raises(ValueError, match=r"K: 9 candidates, but .* holds only K = 8"):
        train_corrector(cfg.replace(K=9), show_progress=False, store=micro_events)


def test_the_cli_refuses_bad_input_in_one_line(
    micro_events: EventStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from brisk.cli import main

    path = _copy(micro_events, tmp_path)
    (path / "features" / "keys.bin").write_bytes(b"")
    cases = [
        (
            ["train", "corrector", "--events", str(path), "--out", str(tmp_path / "o")],
            "keys.bin: 0 bytes",
        ),
        (["train", "corrector", "--events", str(micro_events.path), "--K", "0"], "--K: must be"),
        (
            [
                "train",
                "corrector",
                "collect",
                "--checkpoint",
                str(tmp_path),
                "--out",
                str(tmp_path / "e"),
            ],
            "--checkpoint: ",
        ),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert message in lines[0], lines
    assert not (tmp_path / "o" / "final").exists()
    assert not (tmp_path / "e").exists()
