"""A loopback OpenAI-compatible server whose speed is known by construction.

It is what ``brisk bench serve`` is tested against on a CPU machine, and a quick way to try the
benchmark's flags. A simulated engine runs forwards back to back with continuous batching:

- a forward over n running requests takes ``forward_ms + per_request_ms · n`` milliseconds;
- it commits to each running request ⌊τ⌋ or ⌈τ⌉ tokens (a seeded draw with mean τ = ``tpf``),
  streamed at once as one chunk; a request ends after its ``max_tokens``, or after ``eos_after``
  tokens (its simulated EOS) when it does not ask to ignore EOS.

So with C requests always running, aggregate throughput is C · τ / (forward_ms + per_request_ms
· C) tokens per millisecond, and a server with ``tpf`` τ_B against one with τ_A (same costs) is
τ_B / τ_A faster. ``/server_info`` reports ``avg_spec_accept_length``, the engine's own committed
tokens per request-forward (what ``sglang.benchmark.serving`` reads as the accept length).

Endpoints: ``GET /v1/models``, ``GET /server_info``, ``POST /v1/completions`` (stream or not;
streamed chunks carry ``usage`` only with ``stream_options.continuous_usage_stats``, as
SGLang's). The prompts it was sent are kept in ``prompts``.
Run it with ``python -m brisk.runtime.serving.loopback --port 30000 --tpf 3``.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Engine", "LoopbackServer", "main"]

_DONE = object()


@dataclass
class _Request:
    budget: int
    chunks: queue.Queue[Any]
    sent: int = 0


class Engine:
    """The simulated forward loop (module doc), on its own thread."""

    def __init__(self, tpf: float, forward_ms: float, per_request_ms: float, seed: int = 0) -> None:
        if not tpf >= 1:
            raise ValueError(f"tpf: tokens per forward must be ≥ 1, got {tpf!r}")
        if not (forward_ms > 0 and per_request_ms >= 0):
            raise ValueError(
                f"forward_ms: need > 0 (and per_request_ms ≥ 0), got "
                f"{forward_ms!r}, {per_request_ms!r}"
            )
        self.tpf, self.forward_ms, self.per_request_ms = tpf, forward_ms, per_request_ms
        self._rng = random.Random(seed)
        self._running: list[_Request] = []
        self._lock = threading.Condition()
        self.forwards = 0  # request-forwards
        self.tokens = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def submit(self, max_tokens: int) -> queue.Queue[Any]:
        request = _Request(max_tokens, queue.Queue())
        with self._lock:
            self._running.append(request)
            self._lock.notify()
        return request.chunks

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join()

    def _loop(self) -> None:
        floor = int(self.tpf)
        frac = self.tpf - floor
        while True:
            with self._lock:
                while not self._running and not self._stop:
                    self._lock.wait()
                if self._stop:
                    return
                batch = list(self._running)
            time.sleep((self.forward_ms + self.per_request_ms * len(batch)) / 1000)
            with self._lock:
                for request in batch:
                    n = floor + (self._rng.random() < frac)
                    n = min(n, request.budget - request.sent)
                    request.sent += n
                    self.forwards += 1
                    self.tokens += n
                    request.chunks.put(n)
                    if request.sent >= request.budget:
                        request.chunks.put(_DONE)
                        self._running.remove(request)

    @property
    def accept_length(self) -> float:
        with self._lock:
            return self.tokens / self.forwards if self.forwards else 0.0


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, engine: Engine, model: str, eos_after: int | None = None) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.engine, self.model, self.eos_after = engine, model, eos_after
        self.prompts: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> LoopbackServer:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.engine.stop()


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": self.server.model, "object": "model"}]})
        elif self.path == "/server_info":
            accept = self.server.engine.accept_length
            self._json({"internal_states": [{"avg_spec_accept_length": accept}]})
        else:
            self._json({"error": f"no route {self.path}"}, 404)

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            self._json({"error": f"no route {self.path}"}, 404)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            self._json({"error": f"max_tokens: need an integer ≥ 1, got {max_tokens!r}"}, 400)
            return
        self.server.prompts.append(str(body.get("prompt", "")))
        if self.server.eos_after is not None and not body.get("ignore_eos", False):
            max_tokens = min(max_tokens, self.server.eos_after)
        chunks = self.server.engine.submit(max_tokens)
        if not body.get("stream", False):
            total = 0
            while (n := chunks.get()) is not _DONE:
                total += n
            self._json(
                {
                    "choices": [{"text": " a" * total, "index": 0}],
                    "usage": {"completion_tokens": total},
                }
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        usage = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        total = 0
        while (n := chunks.get()) is not _DONE:
            total += n
            event: dict[str, Any] = {"choices": [{"text": " a" * n, "index": 0}]}
            if usage:  # as SGLang: usage in every chunk only when asked for
                event["usage"] = {"completion_tokens": total}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tpf", type=float, default=3.0, help="tokens per forward τ")
    parser.add_argument("--forward-ms", type=float, default=20.0)
    parser.add_argument("--per-request-ms", type=float, default=0.5)
    parser.add_argument("--model", default="loopback")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eos-after", type=int, help="tokens before a simulated EOS")
    args = parser.parse_args(argv)
    engine = Engine(args.tpf, args.forward_ms, args.per_request_ms, args.seed)
    server = LoopbackServer(args.port, engine, args.model, args.eos_after)
    print(
        f"loopback server on {server.url}: τ = {args.tpf}, {args.forward_ms} ms + "
        f"{args.per_request_ms} ms × running per forward",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.stop()


if __name__ == "__main__":
    main()
