"""The request fuzzer's own checks (:mod:`tests.serving.fuzz`), against a stand-in HTTP server
that answers as told: the negative controls a fuzz run must flag (a 500, a 400 naming no field,
a 200 whose body does not parse, a stream error naming no field), and the answers it must pass.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.serving.fuzz import Tally, named_field, send


class Scripted(BaseHTTPRequestHandler):
    """Answers every POST with the status and body the request's ``answer`` field names."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status, text = body["answer"]
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


ERROR = json.dumps({"error": {"message": "top_k: 2147483648 is past 1073741824"}})


@pytest.mark.parametrize(
    ("status", "text", "stream", "flagged"),
    [
        (500, "Internal Server Error", False, True),
        (400, json.dumps({"error": {"message": "something went wrong"}}), False, True),
        (200, "{not json", False, True),
        (200, 'data: {"error": {"message": "oops", "code": 400}}\n\ndata: [DONE]\n\n', True, True),
        (200, 'data: {"error": {"message": "boom", "code": 500}}\n\n', True, True),
        (400, ERROR, False, False),
        (400, json.dumps({"error": "unknown field `seed`, expected one of `n`"}), False, False),
        (200, json.dumps({"text": "1+1=", "meta_info": {}}), False, False),
        (200, 'data: {"text": "1"}\n\ndata: [DONE]\n\n', True, False),
    ],
    ids=[
        "500",
        "400-no-field",
        "200-bad-json",
        "stream-error-no-field",
        "stream-500",
        "400-field",
        "400-serde-field",
        "200",
        "stream-200",
    ],
)
def test_the_fuzzer_flags_what_a_server_must_not_answer(
    url: str, status: int, text: str, stream: bool, flagged: bool
) -> None:
    tally = Tally()
    send(url, "/generate", {"answer": [status, text], "stream": stream}, False, tally)
    assert bool(tally.failures) == flagged, tally.failures
    assert tally.requests == 1


def test_a_dead_server_is_flagged() -> None:
    tally = Tally()
    send("http://127.0.0.1:9", "/generate", {"text": "x"}, False, tally)  # discard: nothing there
    assert tally.failures
    assert "URLError" in tally.failures[0]


def test_the_field_a_refusal_names() -> None:
    assert named_field("n: 0 completions; ask for at least 1") == "n"
    assert named_field("top_p must be in (0, 1], got 0.") == "top_p"
    assert named_field("unknown field `seed`, expected one of `n`") == "seed"
    assert named_field("invalid type: boolean `true`, expected i64") is None
    assert named_field("something went wrong") is None
