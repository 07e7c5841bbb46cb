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

What each run measured (:class:`Run`) is summarised by :mod:`brisk.runtime.serving.bench_summary`.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisk._atomic import atomic_write_text

__all__ = ["CONCURRENCIES", "Run", "ServeBenchOptions", "read_prompts", "run_once", "sweep"]

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
            raise RuntimeError(
                f"{server}: {len(errors)} request(s) failed at C = {concurrency}, "
                f"e.g. {errors[0]!r}"
            )
        e2e = [t + sum(gaps) for t, gaps in zip(ttfts, itls, strict=True)]
        accept = result.get("accept_length")
        return cls(
            server=server,
            concurrency=concurrency,
            run=run,
            duration_s=float(result["duration"]),
            completed=int(result["completed"]),
            output_tokens=int(result["total_output_tokens"]),
            aggregate_tps=float(result["total_output_tokens"]) / float(result["duration"]),
            request_tps=[n / t for n, t in zip(lens, e2e, strict=True) if t > 0],
            e2e_s=e2e,
            tpf=float(accept) if accept else None,
        )


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
        raise ValueError(
            f"prompts: {options.prompts} holds {len(prompts)} prompts; C = "
            f"{max(options.concurrencies)} with prompts-per-c "
            f"{options.prompts_per_c} needs {need}"
        )
    path = workdir / "prompts.custom.jsonl"
    rows = [
        json.dumps(
            {
                "conversations": [
                    {"role": "user", "content": p},
                    {"role": "assistant", "content": ""},
                ]
            }
        )
        for p in prompts
    ]
    atomic_write_text(path, "\n".join(rows) + "\n")
    return path


def _request_body(o: ServeBenchOptions) -> dict[str, Any]:
    """What every request adds: the temperature, and usage in every streamed chunk, without which
    ``sglang.benchmark.serving`` counts a streamed completion as the ``max_tokens`` it asked for
    (it reads ``usage.completion_tokens`` only from the chunks; SGLang sends it there only with
    ``continuous_usage_stats``), wrong as soon as a response stops at its EOS."""
    return {"temperature": o.temperature, "stream_options": {"continuous_usage_stats": True}}


def _bench_argv(
    url: str,
    tokenizer: str,
    C: int,
    run: int,
    o: ServeBenchOptions,
    out: Path,
    dataset: Path | None = None,
) -> list[str]:
    if dataset is None:
        prompts: dict[str, object] = {
            "--dataset-name": "random-ids",
            "--random-input-len": o.input_len,
            "--random-output-len": o.output_len,
            "--random-range-ratio": "1.0",
        }
    else:
        prompts = {
            "--dataset-name": "custom",
            "--dataset-path": dataset,
            "--sharegpt-output-len": o.output_len,
        }
    flags: dict[str, object] = {
        "--backend": "sglang-oai",
        "--base-url": url,
        "--model": tokenizer,
        "--tokenizer": tokenizer,
        **prompts,
        "--num-prompts": o.prompts_per_c * C,
        "--max-concurrency": C,
        "--seed": o.seed + run,
        "--warmup-requests": o.warmup_requests,
        "--output-file": out,
        "--ready-check-timeout-sec": o.ready_timeout_s,
        "--extra-request-body": json.dumps(_request_body(o)),
    }
    switches = ["--output-details", "--disable-tqdm"]
    if o.stop_at_eos:
        switches.append("--disable-ignore-eos")
    return [*(str(x) for pair in flags.items() for x in pair), *switches]


def run_once(
    server: str,
    url: str,
    tokenizer: str,
    C: int,
    run: int,
    options: ServeBenchOptions,
    workdir: Path,
    log: io.TextIOBase | None = None,
    dataset: Path | None = None,
) -> Run:
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
        raise RuntimeError(
            f"{server}: sglang.benchmark.serving failed at C = {C} ({url}): "
            f"{type(err).__name__}: {err}"
        ) from err
    except SystemExit as exit:
        raise RuntimeError(
            f"{server}: sglang.benchmark.serving exited ({exit.code}) at "
            f"C = {C} (is {url} serving?); see {workdir}/bench_serving.log"
        ) from None
    finally:
        sys.argv = saved
    if not out.is_file():
        raise RuntimeError(
            f"{server}: sglang.benchmark.serving wrote no result at C = {C} (no request finished?)"
        )
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
