"""Proposal training: the weights in the loss, the batch profile, the loss reductions, resume
bit-identity, torchrun equivalence and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.runtime.sampling import counter_uniforms
from brisk.runtime.train.evaluate import encode_example
from brisk.runtime.train.idlm import IGNORE, build_batch, idlm_forward, idlm_loss
from brisk.runtime.train.proposal.acceptance import acceptance_from_beta, slot_table
from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.proposal.data import load_examples
from brisk.runtime.train.proposal.recipe import train_proposal, weighted_loss
from brisk.runtime.train.vocab import stream_losses
from brisk.theory import AcceptanceProfile, CostModel, progress_weights
from tests.runtime.conftest import brisk_here, proposal_args, torchrun


def config(base: Path, dataset: Path, out: Path, **kw: object) -> ProposalTrainConfig:
    values: dict[str, object] = dict(
        init=str(base),
        dataset=str(dataset),
        out_dir=str(out),
        data="selfgen-all",
        stride=4,
        token_budget=2500,
        batch_size=16,
        lr=1e-3,
    )
    values.update(kw)
    return ProposalTrainConfig(**values)  # type: ignore[arg-type]


def records(out: Path) -> list[dict[str, object]]:
    """The run's ``train`` records."""
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in logged if r["event"] == "train"]


def test_brisk_weights_are_progress_weights_of_the_logged_profile(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    cfg = config(micro_base, micro_dataset, tmp_path, profile_decay=0.8)
    train_proposal(cfg, show_progress=False)
    rows = records(tmp_path)
    assert len(rows) >= 5
    ema_r, ema_a = np.zeros(cfg.M), np.zeros(cfg.M)
    for rec in rows:
        # The batch's counts are the ISD rule on its accept lengths: an independent recount.
        hist = np.array(rec["accept_hist"])
        recount = AcceptanceProfile.from_accept_lengths(
            np.repeat(np.arange(cfg.M + 1), hist), cfg.M
        )
        assert rec["batch_reached"] == recount.reached.tolist()
        assert rec["batch_accepted"] == recount.accepted.tolist()
        # The profile is the tracker's posterior mean over the discounted counts of the steps
        # before (the first step's: a probe of its own batch, the same counts) …
        if rec is rows[0]:
            ema_r, ema_a = recount.reached.astype(float), recount.accepted.astype(float)
        np.testing.assert_allclose(rec["profile"], (ema_a + 0.5) / (ema_r + 1), rtol=1e-12)
        ema_r = (0.8 * ema_r + recount.reached) if rec is not rows[0] else ema_r
        ema_a = (0.8 * ema_a + recount.accepted) if rec is not rows[0] else ema_a
        # … and the weights the loss used are its progress weights (ISD cost model).
        expected = progress_weights(np.array(rec["profile"]), CostModel.isd(cfg.M))
        np.testing.assert_allclose(rec["weights"], expected, rtol=1e-6)
    assert (tmp_path / "weights.png").stat().st_size > 0


@pytest.mark.parametrize("scheme", ["uniform", "decay", "dpace"])
def test_baseline_schemes_log_their_weights(
    scheme: str, micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    cfg = config(micro_base, micro_dataset, tmp_path, weights=scheme, token_budget=600)
    train_proposal(cfg, show_progress=False)
    w = np.array([rec["weights"] for rec in records(tmp_path)])
    if scheme == "uniform":
        assert (w == 1).all()
    elif scheme == "decay":
        d = np.exp(-np.arange(cfg.M) / 7.0)
        np.testing.assert_allclose(w, np.broadcast_to(cfg.M * d / d.sum(), w.shape), rtol=1e-6)
    else:  # D-PACE weights are per block and decrease along it
        assert (np.diff(w, axis=1) < 0).all()


def micro_batch(base: Path, offset: int = 1) -> tuple[object, torch.Tensor, torch.Tensor]:
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    pairs = [
        ("Q: 3+4=?\n", "3+4=7\n#### 7"),
        ("Q: 12+5+1=?\n", "12+5=17\n17+1=18\n#### 18"),
        ("Q: 9+9=?\n", "9+9=18\n#### 18"),
    ]
    enc = [encode_example(p, r, tok) for p, r in pairs]
    batch = build_batch(
        [s for s, _ in enc],
        [n for _, n in enc],
        3,
        tok.mask_token_id,
        tok.pad_token_id,
        offset=offset,
    )
    with torch.no_grad():
        noisy, clean = idlm_forward(model, batch)
    return batch, noisy, clean


def test_the_training_forwards_acceptance_is_the_isd_rule_written_out(micro_base: Path) -> None:
    """The verdicts training draws (β from :func:`stream_losses` on the last hidden states, as
    the proposal recipe computes it, then :func:`acceptance_from_beta`) against an independent
    per-block loop on the model's logits: β_i = Σ min(p, q restricted to top-K), a verdict per
    position from the block's uniforms, L = leading accepts; only complete blocks count."""
    batch, noisy, clean = micro_batch(micro_base)
    model = AutoModelForCausalLM.from_pretrained(micro_base)
    with torch.no_grad():
        h_noisy, h_clean = idlm_forward(model, batch, hidden=True)
        losses = stream_losses(
            h_noisy, h_clean, model.lm_head.weight, batch, temperature=1.0, top_k=4
        )
    ids = torch.tensor([10, 11, 12])
    acc = acceptance_from_beta(losses.beta, slot_table(batch), ids, seed=5)
    M, L = batch.M, batch.L
    expected = []
    for b in range(3):
        starts = sorted({int(s) for s in batch.block_start})
        for k, start in enumerate(starts):
            pos = [start + i for i in range(M)]
            if any(j < 0 or j >= L or batch.noisy_labels[b, j] == IGNORE for j in pos):
                continue
            u = counter_uniforms(torch.tensor([5]), ids[b : b + 1], torch.tensor([k]), M)[0]
            verdicts = []
            for i, j in enumerate(pos):
                q = noisy[b, j].double()
                keep = q >= q.topk(4).values[-1]
                q = torch.softmax(q.masked_fill(~keep, -torch.inf), -1)
                p = torch.softmax(clean[b, j].double(), -1)
                verdicts.append(bool(u[i] < torch.minimum(p, q).sum()))
            n = 0
            while n < M and verdicts[n]:
                n += 1
            expected.append((b, k, n))
    got = list(zip(acc.rows.tolist(), acc.blocks.tolist(), acc.accept_len.tolist(), strict=True))
    assert got == expected
    assert len(expected) >= 4


def test_uniform_weights_reduce_to_the_idlm_loss(micro_base: Path) -> None:
    batch, _, _ = micro_batch(micro_base)
    model = AutoModelForCausalLM.from_pretrained(micro_base)
    noisy, clean = idlm_forward(model, batch)
    plain = idlm_loss(noisy, clean, batch, "auto")
    ones = (batch.noisy_labels != IGNORE).float()
    ours = weighted_loss(noisy, clean, batch, ones, "auto")
    # α auto is a float64 ratio of the totals here, a float32 one in idlm_loss: last bits
    torch.testing.assert_close(ours["loss"], plain.loss, rtol=1e-6, atol=0)
    fixed = weighted_loss(noisy, clean, batch, ones, 0.2)
    assert torch.equal(fixed["loss"], idlm_loss(noisy, clean, batch, 0.2).loss)  # type: ignore[arg-type]


def test_reference_data_are_the_reference_corpus_on_the_same_problems(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    cfg = config(micro_base, micro_dataset, tmp_path)
    mine = load_examples(cfg)
    ref = load_examples(cfg.replace(data="reference"))
    assert [e.prompt for e in ref] == [e.prompt for e in mine]
    correct = load_examples(cfg.replace(data="selfgen-correct"))
    assert 0 < len(correct) < len(mine)


def final_params(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def test_resume_after_sigkill_is_bit_identical(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    whole, part = tmp_path / "whole", tmp_path / "part"
    cfg = config(micro_base, micro_dataset, whole, save_every=3, token_budget=3000)
    train_proposal(cfg, show_progress=False)
    cmd = [
        sys.executable,
        "-m",
        "brisk.cli",
        "train",
        "proposal",
        "--init",
        str(micro_base),
        "--dataset",
        str(micro_dataset),
        "--out",
        str(part),
        "--data",
        "selfgen-all",
        "--token-budget",
        "3000",
        "--batch-size",
        "16",
        "--lr",
        "0.001",
        "--save-every",
        "3",
        "--stride",
        "4",
        "--threads",
        "1",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (part / "checkpoint-000006" / "trainer_state.pt").exists():
        assert time.monotonic() < deadline
        assert proc.poll() is None, proc.stderr
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (part / "final").exists()
    subprocess.run([*cmd, "--resume"], check=True, capture_output=True)
    a, b = final_params(whole), final_params(part)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    def timeless(run: Path) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records(run)]

    assert timeless(part) == timeless(whole)  # the log too: nothing lost, nothing twice


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    """P = 2 (gloo) vs one process at the same global batch: the same acceptance counts and
    weights (integers, exact), losses to rtol 1e-5 and parameters to atol 1e-5 (float sums in
    another order)."""
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run(
        [sys.executable, "-m", "brisk.cli", *proposal_args(micro_base, micro_dataset, one)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        torchrun(2, proposal_args(micro_base, micro_dataset, two)),
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    r1, r2 = records(one), records(two)
    assert len(r1) == len(r2) >= 3
    for x, y in zip(r1, r2, strict=True):
        assert (x["batch_reached"], x["batch_accepted"]) == (
            y["batch_reached"],
            y["batch_accepted"],
        )
        assert x["tokens"] == y["tokens"]
        np.testing.assert_allclose(y["weights"], x["weights"], rtol=1e-6)
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
    a, b = final_params(one), final_params(two)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)
    shutil.rmtree(two)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(
            ["--weights", "cosine"],
            "--weights: invalid choice: 'cosine' (choose from "
            "'brisk', 'uniform', 'dpace', 'decay')",
            id="mode",
        ),
        pytest.param(
            ["--data", "web"],
            "--data: invalid choice: 'web' (choose from 'selfgen-correct'",
            id="data",
        ),
        pytest.param(
            ["--init", "/nonexistent"],
            "--init: /nonexistent is not a checkpoint",
            id="missing-init",
        ),
        pytest.param(
            ["--dataset", "/nonexistent"], "not a self-generated dataset", id="missing-dataset"
        ),
        pytest.param(
            ["--stride", "8"], "was decoded at stride 4, training uses stride 8", id="stride"
        ),
        pytest.param(["--stride", "1"], "--stride: need N ≥ 2", id="bad-stride"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    extra: list[str], message: str, micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    args = [
        "train",
        "proposal",
        "--stride",
        "4",
        "--init",
        str(micro_base),
        "--dataset",
        str(micro_dataset),
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    done = brisk_here(*args, *extra)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1
    assert message in lines[0]
    assert not (tmp_path / "run").exists()


def test_all_incorrect_or_foreign_datasets_are_refused(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    bad = tmp_path / "wrong"
    shutil.copytree(micro_dataset, bad)
    for part in bad.glob("part-*.parquet"):
        t = pq.read_table(part)
        t = t.set_column(
            t.schema.get_field_index("correct"), "correct", pc.and_(t["correct"], False)
        )
        pq.write_table(t, part)
    with pytest.raises(ValueError, match="no correct response"):
        load_examples(config(micro_base, bad, tmp_path / "r", data="selfgen-correct"))
    prov = json.loads((bad / "_provenance.json").read_text())
    prov["tokenizer_hash"] = "0" * 16
    (bad / "_provenance.json").write_text(json.dumps(prov))
    with pytest.raises(ValueError, match="another tokenizer"):
        load_examples(config(micro_base, bad, tmp_path / "r"))


def test_selfgen_data_of_another_checkpoint_is_refused(
    micro_base: Path, micro_dataset: Path, tmp_path: Path
) -> None:
    """Self-generated data trains the model that generated it: a dataset whose provenance names
    other weights is refused by name (from the CLI: one line, exit 2), while the reference arm,
    which takes only the dataset's problems, still accepts it."""
    foreign = tmp_path / "foreign"
    shutil.copytree(micro_dataset, foreign)
    prov = json.loads((foreign / "_provenance.json").read_text())
    prov["checkpoint"], prov["checkpoint_hash"] = "runs/other/final", "f" * 16
    (foreign / "_provenance.json").write_text(json.dumps(prov))
    for data in ("selfgen-all", "selfgen-correct"):
        with pytest.raises(ValueError, match=r"generated by another checkpoint \(runs/other"):
            load_examples(config(micro_base, foreign, tmp_path / "r", data=data))
    assert load_examples(config(micro_base, foreign, tmp_path / "r", data="reference"))
    args = [
        "train",
        "proposal",
        "--stride",
        "4",
        "--init",
        str(micro_base),
        "--dataset",
        str(foreign),
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
    ]
    done = brisk_here(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"brisk: error: --dataset: {foreign} was generated by another checkpoint "
        f"(runs/other/final) than --init {micro_base}; self-generated data comes from the "
        f"model it trains (brisk train selfgen --checkpoint {micro_base})"
    ]
    assert not (tmp_path / "run").exists()
