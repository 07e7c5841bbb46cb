"""The serving benchmark's summary math and the ``BriskISD`` options, without SGLang (the sweep
itself runs against loopback servers in ``tests/serving``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from brisk.runtime.serving.bench import Run
from brisk.runtime.serving.bench_summary import compare, markdown, summarize
from brisk.runtime.serving.options import BriskISDOptions, OptionError


def run(server: str, C: int, i: int, tps: float, tpf: float | None = None) -> Run:
    return Run(
        server,
        C,
        i,
        duration_s=1.0,
        completed=C,
        output_tokens=int(tps),
        aggregate_tps=tps,
        request_tps=[tps / C] * C,
        e2e_s=[1.0 + i] * C,
        tpf=tpf,
    )


ratios = st.lists(st.floats(0.25, 4.0), min_size=1, max_size=6)


@given(ratios, st.integers(1, 4))
def test_geomean_across_C_of_exact_ratios(rs: list[float], k: int) -> None:
    """B = r_C · A in every run: per-C ratios are r_C exactly, the summary is (∏ r_C)^(1/n)."""
    runs = []
    for C, r in enumerate(rs, start=1):
        for i in range(k):
            base = 100.0 * (i + 1)  # runs differ; the pairing removes it
            runs += [run("A", C, i, base), run("B", C, i, base * r)]
    rows = compare(runs, "A", "B")
    assert [q.concurrency for q in rows] == [*range(1, len(rs) + 1), None]
    for q, r in zip(rows, rs, strict=False):
        assert q.ratio.mean == pytest.approx(r, rel=1e-12)
        assert q.pairs == k
    assert rows[-1].ratio.mean == pytest.approx(math.prod(rs) ** (1 / len(rs)), rel=1e-12)


def test_ratio_interval_is_a_t_interval_on_the_log_scale() -> None:
    from scipy import stats

    logs = [math.log(1.1), math.log(1.3), math.log(1.2)]
    runs = [
        x
        for i, lr in enumerate(logs)
        for x in (run("A", 4, i, 50.0), run("B", 4, i, 50.0 * math.exp(lr)))
    ]
    q = compare(runs, "A", "B")[0]
    half = stats.t.ppf(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
    assert q.ratio.mean == pytest.approx(math.exp(np.mean(logs)))
    assert q.ratio.low == pytest.approx(math.exp(np.mean(logs) - half))
    assert q.ratio.high == pytest.approx(math.exp(np.mean(logs) + half))


def test_compare_needs_pairs() -> None:
    with pytest.raises(ValueError, match="no paired runs"):
        compare([run("A", 1, 0, 10.0), run("B", 2, 0, 10.0)], "A", "B")


def test_summary_pools_requests_and_reads_the_server_tpf() -> None:
    runs = [run("A", 2, 0, 100.0, tpf=3.0), run("A", 2, 1, 120.0, tpf=3.2)]
    (row,) = summarize(runs)
    assert row.aggregate_tps.mean == pytest.approx(110.0)
    assert row.median_request_tps == pytest.approx(55.0)  # per-request 50, 50, 60, 60
    assert row.p95_latency_s == pytest.approx(np.percentile([1, 1, 2, 2], 95))
    assert row.tpf == pytest.approx(3.1)
    assert "| A | 2 | 110.0 [" in markdown([row])


def test_run_from_a_bench_serving_result() -> None:
    result = {
        "duration": 2.0,
        "completed": 2,
        "total_output_tokens": 8,
        "output_lens": [4, 4],
        "ttfts": [0.1, 0.2],
        "itls": [[0.1, 0.2], [0.3]],
        "errors": ["", ""],
        "accept_length": 2.5,
    }
    r = Run.from_result("A", 2, 0, result)
    assert r.aggregate_tps == 4.0
    assert r.e2e_s == pytest.approx([0.4, 0.5])
    assert r.request_tps == pytest.approx([10.0, 8.0])
    assert r.tpf == 2.5
    with pytest.raises(RuntimeError, match="1 request\\(s\\) failed at C = 2"):
        Run.from_result("A", 2, 0, {**result, "errors": ["", "boom"]})


def test_bench_serve_without_sglang_is_one_line(tmp_path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import importlib.util

    from brisk.cli import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sglang" else find_spec(name, *a),
    )
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text("{}")
    code = main(
        [
            "bench",
            "serve",
            "--url",
            "http://127.0.0.1:9",
            "--tokenizer",
            str(tok),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert "install the serving extra" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stride": 4, "shadow": "yes"}, "shadow: need true or false"),
        ({"stride": True}, "stride: need an integer N ≥ 2"),
        ({"seed": 1.5}, "seed: need an integer"),
        ({"temperature": "hot"}, "temperature: need a number ≥ 0"),
        ({"stride": 4, "strid": 3}, "strid: unknown BriskISD option"),
    ],
)
def test_options_name_the_bad_option(options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        BriskISDOptions.from_mapping(options)


def test_options_derive_the_block() -> None:
    o = BriskISDOptions.from_mapping({"stride": 8, "block_size": 15})
    assert (o.M, o.block_size) == (7, 15)


def test_compare_refuses_incomplete_pairs() -> None:
    runs = [run("A", 1, 0, 10.0), run("B", 1, 0, 12.0), run("A", 2, 0, 10.0)]
    with pytest.raises(ValueError, match="run 0 at C = 2 has no pair"):
        compare(runs, "A", "B")


def test_json_of_one_run_is_strict() -> None:
    """An interval over one run has no bounds: null in the JSON, never a NaN token."""
    import json

    from brisk.runtime.serving.bench import ServeBenchOptions
    from brisk.runtime.serving.bench_summary import dumps, to_json

    runs = [run("A", 1, 0, 10.0), run("B", 1, 0, 12.0)]
    text = dumps(
        to_json(
            runs,
            summarize(runs),
            compare(runs, "A", "B"),
            ServeBenchOptions(runs=1),
            {"A": "a", "B": "b"},
        )
    )
    doc = json.loads(text)
    assert "NaN" not in text
    assert doc["summary"][0]["aggregate_tps"]["low"] is None
    assert doc["ratios"][0]["ratio"]["mean"] == pytest.approx(1.2)
