"""The speed report through the doors a user walks: ``brisk decode --plain`` (the baseline),
``brisk decode --drafter`` and ISD one request at a time on a Llama checkpoint without a MASK
token, then ``brisk bench speed`` over their answer files.

Greedy decoding by any exact decoder is the target's own greedy decoding, so every output must
equal the baseline's (the report's ``equal``); plain decoding spends one forward per token (τ =
1) and its rows are a full-recompute argmax loop's, token for token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from brisk.cli import main
from tests.runtime.test_decode_drafter import MAX_NEW, PROMPTS, Pair, pair, prompt_ids

__all__ = ["pair"]  # the module fixture, shared with the drafter's decode tests

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CATEGORIES = ["code", "text", "text", "chat"]


def drafter_mask(pair: Pair) -> str:
    """The drafter's MASK id, a free id of the target's vocabulary: ISD's MASK on it too."""
    config = json.loads((pair.drafter / "config.json").read_text())
    return str(config["dflash_config"]["mask_token_id"])


def run(pair: Pair, tmp_path: Path, name: str, *extra: str) -> tuple[Path, list[dict[str, Any]]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": p, "id": f"q{i}", "category": c}) + "\n"
            for i, (p, c) in enumerate(zip(PROMPTS, CATEGORIES, strict=True))
        )
    )
    out = tmp_path / f"{name}.jsonl"
    argv = ["decode", "--model", str(pair.target), "--prompts", str(prompts), "--out", str(out)]
    assert main([*argv, "--max-new-tokens", str(MAX_NEW), "--no-progress", *extra]) == 0
    return out, [json.loads(line) for line in out.read_text().splitlines()]


def test_plain_drafter_and_isd_answers_make_spec_benchs_report(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eos = pair.tokenizer.eos_token_id
    plain, rows = run(pair, tmp_path, "plain", "--plain")
    assert "plain decoding" in capsys.readouterr().out
    for row, category in zip(rows, CATEGORIES, strict=True):
        assert row["decoder"] == "plain"
        assert row["category"] == category
        assert row["prompt_ids"] == prompt_ids(pair.tokenizer, row["prompt"])
        assert row["output_ids"] == pair.greedy(row["prompt_ids"], MAX_NEW, eos)
        assert row["forwards"] == row["tokens"] == len(row["output_ids"])
        assert row["wall_s"] > 0
    sd, _ = run(pair, tmp_path, "sd", "--drafter", str(pair.drafter))
    mask = drafter_mask(pair)
    isd, isd_rows = run(
        pair, tmp_path, "isd", "--stride", "4", "--mask-token-id", mask, "--batch-size", "1"
    )
    assert all(r["wall_s"] > 0 for r in isd_rows)
    out = tmp_path / "report"
    argv = ["bench", "speed", "--baseline", str(plain), "--run", f"sd={sd}", "--run", f"isd={isd}"]
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "speed.json").read_text())
    by = {(r["method"], r["category"]): r for r in summary["rows"]}
    assert set(by) == {(m, c) for m in ("sd", "isd") for c in ("chat", "code", "text", "all")}
    for (method, category), r in by.items():
        assert r["equal"] == r["requests"], (method, category)  # greedy: the target's outputs
        assert r["speedup"] > 0
    sd_rows = [json.loads(line) for line in sd.read_text().splitlines()]
    tokens = sum(r["tokens"] for r in sd_rows)
    assert by["sd", "all"]["tau"] == pytest.approx(tokens / sum(r["forwards"] for r in sd_rows))
    assert by["sd", "all"]["tau"] > 1  # some drafts were accepted
    assert "| sd | all | 4 |" in capsys.readouterr().out


def test_plain_refuses_what_it_has_not_and_batched_isd_has_no_request_times(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f():"}) + "\n")
    base = ["decode", "--model", str(pair.target), "--prompts", str(prompts), "--plain"]
    for extra, flag in [
        (["--stride", "4"], "--stride"),
        (["--log-blocks", str(tmp_path / "log")], "--log-blocks"),
        (["--drafter", str(pair.drafter)], "--drafter"),
    ]:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"brisk: error: {flag}:"), err
        assert err.count("\n") == 1, err
    assert not (tmp_path / "log").exists()
    mask = drafter_mask(pair)
    batched, rows = run(pair, tmp_path, "batched", "--stride", "4", "--mask-token-id", mask)
    assert all("wall_s" not in r for r in rows)
    plain, _ = run(pair, tmp_path, "plain", "--plain")
    capsys.readouterr()
    assert main(["bench", "speed", "--baseline", str(plain), "--run", f"isd={batched}"]) == 2
    assert "no wall_s (decode one request at a time, --batch-size 1" in capsys.readouterr().err
