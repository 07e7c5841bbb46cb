"""``brisk bench serve``: the paper's serving protocol over ``sglang.benchmark.serving``.

For every concurrency C (default 1, 2, 4, 8, 16, 32) and run (default 3), one
``sglang.benchmark.serving`` run against each server, ``--max-concurrency C`` over
``prompts_per_c · C`` requests. The prompts are ``--dataset-name random-ids`` prompts of a fixed
length (``--random-range-ratio 1.0``), or, with ``prompts`` (a JSON Lines file of ``{"prompt":
...}`` rows, as ``brisk tasks export`` writes them), the file's own prompts drawn by the run's
seed (SGLang's ``custom`` dataset). Every request generates exactly ``output_len`` (default
2,048) tokens, EOS ignored; with ``stop_at_eos`` it stops at its EOS, ``output_len`` a cap, so
responses have their natural lengths. With several servers the runs interleave (A then B for
each C and run), so each ratio is paired under the same conditions.

Per (server, C), over the runs:

- **aggregate TPS**: generated tokens ÷ the run's duration, mean and 95 % t-interval;
- **median request TPS**: a request's tokens ÷ its end-to-end latency (first token + the inter-
  token gaps), median over every request of every run;
- **p95 latency**: 95th percentile of end-to-end request latency, pooled;
- **TPF**: the server's own counter as ``sglang.benchmark.serving`` reads it after the run
  (``/server_info``'s ``avg_spec_accept_length``): SGLang keeps it for speculative decoding, as
  an average over the server's lifetime (warm-up and earlier C included), and has none for dLLM
  algorithms, where the column stays empty.

Comparison (every later server against every earlier one, :func:`comparisons`): per C the
paired ratios B ÷ A of aggregate TPS, their geometric mean over runs with a
t-interval on the log scale; across C the geometric mean of the per-C ratios (the paper's
summary), its interval from the runs' own geometric means across C.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from brisk._atomic import atomic_write, atomic_write_text
from brisk.mechanism.stats import Interval

__all__ = [
    "CONCURRENCIES",
    "RatioRow",
    "Run",
    "ServeBenchOptions",
    "SweepRow",
    "compare",
    "dumps",
    "markdown",
    "read_prompts",
    "run_once",
    "summarize",
    "sweep",
]

CONCURRENCIES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class ServeBenchOptions:
    concurrencies: tuple[int, ...] = CONCURRENCIES
    runs: int = 3
    input_len: int = 128
    output_len: int = 2048
    prompts_per_c: int = 4
    temperature: float = 0.0
    seed: int = 0
    warmup_requests: int = 1
    ready_timeout_s: int = 60  # how long to wait for a server's /v1/models
    prompts: str | None = None  # a JSON Lines file of {"prompt": ...}; None: random ids
    stop_at_eos: bool = False  # False: exactly output_len tokens per request

    def __post_init__(self) -> None:
        if not self.concurrencies or any(
            not isinstance(c, int) or c < 1 for c in self.concurrencies
        ):
            raise ValueError(f"concurrency: need integers ≥ 1, got {self.concurrencies!r}")
        for name in ("runs", "input_len", "output_len", "prompts_per_c", "ready_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')}: need an integer ≥ 1, got {value!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: need ≥ 0, got {self.temperature!r}")


@dataclass(frozen=True)
class Run:
    """One ``sglang.benchmark.serving`` run of one server at one concurrency."""

    server: str
    concurrency: int
    run: int
    duration_s: float
    completed: int
    output_tokens: int
    aggregate_tps: float
    request_tps: list[float] = field(repr=False)
    e2e_s: list[float] = field(repr=False)
    tpf: float | None

    @classmethod
    def from_result(cls, server: str, concurrency: int, run: int, result: dict[str, Any]) -> Run:
        """From one line of ``--output-file`` written with ``--output-details``."""
        lens, ttfts, itls = result["output_lens"], result["ttfts"], result["itls"]
        errors = [e for e in result.get("errors", []) if e]
        if errors:
            raise RuntimeError(f"{server}: {len(errors)} request(s) failed at C = {concurrency}, "
                               f"e.g. {errors[0]!r}")  # fmt: skip
        e2e = [t + sum(gaps) for t, gaps in zip(ttfts, itls, strict=True)]
        accept = result.get("accept_length")
        return cls(
            server=server, concurrency=concurrency, run=run,
            duration_s=float(result["duration"]), completed=int(result["completed"]),
            output_tokens=int(result["total_output_tokens"]),
            aggregate_tps=float(result["total_output_tokens"]) / float(result["duration"]),
            request_tps=[n / t for n, t in zip(lens, e2e, strict=True) if t > 0],
            e2e_s=e2e, tpf=float(accept) if accept else None,
        )  # fmt: skip


def read_prompts(path: str | Path) -> list[str]:
    """The ``prompt`` strings of a JSON Lines file, one per row (blank lines skipped); a row
    that is not a JSON object with a non-empty string ``prompt`` is a ``ValueError`` naming the
    file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts: {path} is not a file")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"prompts: {path}:{number}: not JSON ({err.msg})") from None
        prompt = row.get("prompt") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f'prompts: {path}:{number}: needs a non-empty string "prompt"')
        prompts.append(prompt)
    return prompts


def _custom_dataset(options: ServeBenchOptions, workdir: Path) -> Path | None:
    """``options.prompts`` in the format of SGLang's ``custom`` dataset (a user turn, and an
    assistant turn it does not use when the output length is fixed), checked to hold enough
    prompts for the largest C; ``None`` for random ids."""
    if options.prompts is None:
        return None
    prompts = read_prompts(options.prompts)
    need = options.prompts_per_c * max(options.concurrencies)
    if len(prompts) < need:
        raise ValueError(f"prompts: {options.prompts} holds {len(prompts)} prompts; C = "
                         f"{max(options.concurrencies)} with prompts-per-c "
                         f"{options.prompts_per_c} needs {need}")  # fmt: skip
    path = workdir / "prompts.custom.jsonl"
    rows = [json.dumps({"conversations": [{"role": "user", "content": p},
                                          {"role": "assistant", "content": ""}]})
            for p in prompts]  # fmt: skip
    atomic_write_text(path, "\n".join(rows) + "\n")
    return path


def _request_body(o: ServeBenchOptions) -> dict[str, Any]:
    """What every request adds: the temperature, and usage in every streamed chunk, without which
    ``sglang.benchmark.serving`` counts a streamed completion as the ``max_tokens`` it asked for
    (it reads ``usage.completion_tokens`` only from the chunks; SGLang sends it there only with
    ``continuous_usage_stats``), wrong as soon as a response stops at its EOS."""
    return {"temperature": o.temperature, "stream_options": {"continuous_usage_stats": True}}


def _bench_argv(url: str, tokenizer: str, C: int, run: int, o: ServeBenchOptions,
                out: Path, dataset: Path | None = None) -> list[str]:  # fmt: skip
    if dataset is None:
        prompts = ["--dataset-name", "random-ids", "--random-input-len", str(o.input_len),
                   "--random-output-len", str(o.output_len),
                   "--random-range-ratio", "1.0"]  # fmt: skip
    else:
        prompts = ["--dataset-name", "custom", "--dataset-path", str(dataset),
                   "--sharegpt-output-len", str(o.output_len)]  # fmt: skip
    return [
        "--backend", "sglang-oai", "--base-url", url, "--model", tokenizer,
        "--tokenizer", tokenizer, *prompts, "--num-prompts", str(o.prompts_per_c * C),
        "--max-concurrency", str(C), "--seed", str(o.seed + run),
        "--warmup-requests", str(o.warmup_requests), "--output-file", str(out),
        "--ready-check-timeout-sec", str(o.ready_timeout_s),
        "--output-details", "--disable-tqdm",
        *(["--disable-ignore-eos"] if o.stop_at_eos else []),
        "--extra-request-body", json.dumps(_request_body(o)),
    ]  # fmt: skip


def run_once(
    server: str, url: str, tokenizer: str, C: int, run: int, options: ServeBenchOptions,
    workdir: Path, log: io.TextIOBase | None = None, dataset: Path | None = None,
) -> Run:  # fmt: skip
    """One run through ``sglang.benchmark.serving``'s own command line, in this process
    (``dataset``: the prompts file :func:`sweep` wrote, for ``options.prompts``)."""
    from brisk.runtime.serving.cpu import ensure_torchvision

    ensure_torchvision()  # SGLang's configs import torchvision; a CPU install has the stand-in
    try:
        from sglang.benchmark import serving
    except ModuleNotFoundError as err:  # sglang's configs import torchvision, among others
        raise RuntimeError(
            f"sglang.benchmark.serving cannot be imported here: {err} (SGLang imports it "
            "through sglang.srt.configs; install it beside sglang)"
        ) from err

    out = workdir / f"{server}_C{C}_run{run}.jsonl"
    out.unlink(missing_ok=True)
    argv = ["sglang.benchmark.serving", *_bench_argv(url, tokenizer, C, run, options, out, dataset)]
    sink = log if log is not None else io.StringIO()
    saved = sys.argv
    try:
        sys.argv = argv
        with contextlib.redirect_stdout(sink):  # type: ignore[type-var]
            serving.cli_main()
    except (OSError, ValueError, KeyError) as err:  # connection, JSON, result fields
        raise RuntimeError(f"{server}: sglang.benchmark.serving failed at C = {C} ({url}): "
                           f"{type(err).__name__}: {err}") from err  # fmt: skip
    except SystemExit as exit:
        raise RuntimeError(f"{server}: sglang.benchmark.serving exited ({exit.code}) at "
                           f"C = {C} (is {url} serving?); see {workdir}/bench_serving.log"
                           ) from None  # fmt: skip
    finally:
        sys.argv = saved
    if not out.is_file():
        raise RuntimeError(f"{server}: sglang.benchmark.serving wrote no result at C = {C} "
                           "(no request finished?)")  # fmt: skip
    lines = out.read_text().strip().splitlines()
    return Run.from_result(server, C, run, json.loads(lines[-1]))


def sweep(
    servers: dict[str, str],
    tokenizer: str,
    options: ServeBenchOptions,
    workdir: Path,
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every (C, run) for every server, servers interleaved within each (C, run)."""
    if not servers:
        raise ValueError("url: need at least one server")
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = _custom_dataset(options, workdir)
    runs = []
    with (workdir / "bench_serving.log").open("a") as log:
        for C in options.concurrencies:
            for r in range(options.runs):
                for name, url in servers.items():
                    result = run_once(name, url, tokenizer, C, r, options, workdir, log, dataset)
                    runs.append(result)
                    if on_run is not None:
                        on_run(result)
    return runs


@dataclass(frozen=True)
class SweepRow:
    server: str
    concurrency: int
    aggregate_tps: Interval
    median_request_tps: float
    p95_latency_s: float
    tpf: float | None
    runs: int


def summarize(runs: Sequence[Run]) -> list[SweepRow]:
    """One row per (server, C), in the order the runs came."""
    keys = list(dict.fromkeys((r.server, r.concurrency) for r in runs))
    rows = []
    for server, C in keys:
        group = [r for r in runs if (r.server, r.concurrency) == (server, C)]
        request_tps = [t for r in group for t in r.request_tps]
        e2e = [t for r in group for t in r.e2e_s]
        tpfs = [r.tpf for r in group if r.tpf is not None]
        rows.append(SweepRow(
            server=server, concurrency=C,
            aggregate_tps=Interval.of([r.aggregate_tps for r in group]),
            median_request_tps=statistics.median(request_tps) if request_tps else math.nan,
            p95_latency_s=float(np.percentile(e2e, 95)) if e2e else math.nan,
            tpf=statistics.fmean(tpfs) if tpfs else None,
            runs=len(group),
        ))  # fmt: skip
    return rows


@dataclass(frozen=True)
class RatioRow:
    concurrency: int | None  # None: the geometric mean across C
    ratio: Interval  # geometric mean of paired ratios, interval mapped back from the log scale
    pairs: int


def _geometric(logs: Sequence[float]) -> Interval:
    iv = Interval.of(logs)
    return Interval(math.exp(iv.mean), math.exp(iv.low), math.exp(iv.high), iv.k)


def compare(runs: Sequence[Run], baseline: str, candidate: str) -> list[RatioRow]:
    """Paired aggregate-TPS ratios candidate ÷ baseline per C, then their geometric mean across
    C (module doc). Runs pair by (C, run index)."""
    tps = {(r.server, r.concurrency, r.run): r.aggregate_tps for r in runs}
    Cs = list(dict.fromkeys(r.concurrency for r in runs))
    log_ratio: dict[tuple[int, int], float] = {}
    for (server, C, i), value in tps.items():
        if server == candidate and (baseline, C, i) in tps:
            log_ratio[C, i] = math.log(value / tps[baseline, C, i])
    if not log_ratio:
        raise ValueError(f"runs: no paired runs of {candidate!r} and {baseline!r}")
    indices = sorted({i for _, i in log_ratio})
    missing = [(C, i) for C in Cs for i in indices if (C, i) not in log_ratio]
    if missing:  # an across-C mean over fewer C would bias that run's summary
        C, i = missing[0]
        raise ValueError(f"runs: run {i} at C = {C} has no pair of {candidate!r} and "
                         f"{baseline!r}; compare needs every (C, run) of both")  # fmt: skip
    rows = []
    for C in Cs:
        logs = [v for (c, _), v in log_ratio.items() if c == C]
        if logs:
            rows.append(RatioRow(C, _geometric(logs), len(logs)))
    per_run = [
        statistics.fmean(log_ratio[C, i] for C in Cs if (C, i) in log_ratio) for i in indices
    ]
    rows.append(RatioRow(None, _geometric(per_run), len(per_run)))
    return rows


def markdown(rows: Sequence[SweepRow], ratios: Sequence[RatioRow] = (), names: str = "") -> str:
    lines = [
        "| server | C | aggregate TPS | median request TPS | p95 latency (s) | TPF | runs |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        tpf = "" if r.tpf is None else f"{r.tpf:.2f}"
        lines.append(
            f"| {r.server} | {r.concurrency} | {r.aggregate_tps.format(digits=1)} | "
            f"{r.median_request_tps:.1f} | {r.p95_latency_s:.3f} | {tpf} | {r.runs} |"
        )
    text = "\n".join(lines) + "\n"
    return text + ("\n" + ratio_table(ratios, names) if ratios else "")


def ratio_table(ratios: Sequence[RatioRow], names: str) -> str:
    """The paired ratios of one comparison (``names``: "B ÷ A") as a markdown table."""
    lines = [f"| C | TPS ratio {names} | pairs |", "|---:|---|---:|"]
    for q in ratios:
        c = "geomean over C" if q.concurrency is None else str(q.concurrency)
        lines.append(f"| {c} | {q.ratio.format(digits=3)} | {q.pairs} |")
    return "\n".join(lines) + "\n"


def comparisons(runs: Sequence[Run], labels: Sequence[str]) -> dict[str, list[RatioRow]]:
    """Every later server against every earlier one, ``"B ÷ A" → compare(runs, A, B)``, in
    the order of ``labels`` (A ÷ nothing for one server: empty)."""
    return {
        f"{b} ÷ {a}": compare(runs, a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]
    }


def to_json(runs: Sequence[Run], rows: Sequence[SweepRow], ratios: Sequence[RatioRow],
            options: ServeBenchOptions, servers: dict[str, str],
            more: dict[str, list[RatioRow]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The document: ``ratios`` are the first comparison's (second ÷ first server), ``more``
    every comparison by name (:func:`comparisons`)."""
    return {
        "options": asdict(options), "servers": servers,
        "summary": [asdict(r) for r in rows], "ratios": [asdict(q) for q in ratios],
        "comparisons": {k: [asdict(q) for q in v] for k, v in (more or {}).items()},
        "runs": [asdict(r) for r in runs],
    }  # fmt: skip


def _null_nan(x: Any) -> Any:
    """NaN (an interval over one run) as JSON null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _null_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_null_nan(v) for v in x]
    return x


def dumps(document: dict[str, Any]) -> str:
    """Strict JSON (no NaN tokens) of :func:`to_json`'s document."""
    return json.dumps(_null_nan(document), indent=1, allow_nan=False)


def plot(
    rows: Sequence[SweepRow],
    ratios: Sequence[RatioRow] | dict[str, list[RatioRow]],
    path: Path,
    names: str = "",
) -> Path:
    """Aggregate TPS against C per server (95 % intervals), and the ratio per C of one
    comparison (``ratios`` named ``names``) or several (``{names: ratios}``); written
    atomically to ``path`` (PNG)."""
    pairs = dict(ratios) if isinstance(ratios, dict) else ({names: list(ratios)} if ratios else {})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = 2 if pairs else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    for server in dict.fromkeys(r.server for r in rows):
        mine = [r for r in rows if r.server == server]
        x = [r.concurrency for r in mine]
        y = [r.aggregate_tps.mean for r in mine]
        tps = [r.aggregate_tps for r in mine]
        below = [0.0 if math.isnan(t.low) else t.mean - t.low for t in tps]
        above = [0.0 if math.isnan(t.high) else t.high - t.mean for t in tps]
        err = [below, above]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=server)
    ax.set(xscale="log", xlabel="concurrency C", ylabel="aggregate tokens/s",
           title="serving sweep")  # fmt: skip
    ax.set_xticks([r.concurrency for r in rows], [str(r.concurrency) for r in rows])
    ax.minorticks_off()  # no "3 × 10⁰" between the concurrencies
    ax.legend()
    if pairs:
        ax = axes[0][1]
        for (name, ratio), color in zip(pairs.items(), plt.rcParams["axes.prop_cycle"],
                                        strict=False):  # fmt: skip
            per_c = [q for q in ratio if q.concurrency is not None]
            below = [0.0 if math.isnan(q.ratio.low) else q.ratio.mean - q.ratio.low
                     for q in per_c]  # fmt: skip
            above = [0.0 if math.isnan(q.ratio.high) else q.ratio.high - q.ratio.mean
                     for q in per_c]  # fmt: skip
            overall = ratio[-1].ratio.mean
            ax.errorbar([q.concurrency for q in per_c], [q.ratio.mean for q in per_c],
                        yerr=[below, above], marker="o", capsize=3, color=color["color"],
                        label=f"{name} (geomean {overall:.3f})")  # fmt: skip
            ax.axhline(overall, ls="--", color=color["color"], lw=0.8)
        ax.axhline(1.0, color="black", lw=0.5)
        ylabel = f"TPS ratio {next(iter(pairs))}" if len(pairs) == 1 else "paired TPS ratio"
        # ratios and their intervals live on the log scale (a wide interval stays readable)
        ax.set(xscale="log", yscale="log", xlabel="concurrency C", ylabel=ylabel,
               title="paired ratio (log scale)")  # fmt: skip
        ax.set_xticks([q.concurrency for q in per_c], [str(q.concurrency) for q in per_c])
        ax.minorticks_off()
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path
