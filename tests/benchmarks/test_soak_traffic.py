"""benchmarks/soak_traffic.py's classification of a refusal: a 503 with a JSON reason is an
allowed outcome, and its reason is kept for the result (a count alone does not say whether the
daemon refused for a cause a reader would accept). Against a real HTTP server on a socket."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from soak_traffic import Traffic

REASON = "target 'a' is restarting: proxy.hold of 1s ran out"


class JsonReplies(BaseHTTPRequestHandler):
    """A server that reads each request's body and answers `answer()` as JSON."""

    def answer(self) -> tuple[int, dict[str, object]]:
        raise NotImplementedError

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, reply = self.answer()
        body = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Refusing(JsonReplies):
    def answer(self) -> tuple[int, dict[str, object]]:
        return (503 if self.path == "/v1/completions" else 500), {"error": {"message": REASON}}


def test_refusals_are_kept_with_their_reason_and_other_statuses_are_lost():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = threading.Event()
    up.set()
    try:
        traffic = Traffic("127.0.0.1", server.server_address[1], ["a"], clients=1, hold=1,
                          seed=3, daemon_up=up)
        traffic.start()
        deadline = time.monotonic() + 30
        while (not traffic.refused or not traffic.lost) and time.monotonic() < deadline:
            time.sleep(0.05)
        traffic.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert traffic.refused and traffic.lost
    assert all(REASON in r["detail"] and r["target"] == "a" for r in traffic.refused)
    assert all(r["detail"].startswith("500 ") for r in traffic.lost)
    assert traffic.counts["refused"] >= len(traffic.refused)


class KeyChecking(JsonReplies):
    """Answers only the bearer key in `server.key` (what the daemon does after a rotation)."""

    def answer(self) -> tuple[int, dict[str, object]]:
        if self.headers.get("Authorization") == f"Bearer {self.server.key}":  # type: ignore[attr-defined]
            return 200, {"choices": [{"text": "hi"}]}
        return 401, {"error": {"message": "no key that matches"}}


def test_a_request_that_met_a_rotation_is_sent_again_with_the_new_key_and_a_wrong_key_is_lost():
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyChecking)
    server.key = "new"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = threading.Event()
    up.set()
    # The client read "old" just before the file was rewritten, then reads "new".
    reads = iter(["old", "new", "new", "wrong", "wrong"])
    try:
        traffic = Traffic("127.0.0.1", server.server_address[1], ["a"], clients=1, hold=1,
                          seed=3, daemon_up=up, key=lambda: next(reads))
        rotated = traffic.one("a", "completion", "Hello", 4)
        fine = traffic.one("a", "completion", "Hello", 4)
        unchanged = traffic.one("a", "completion", "Hello", 4)  # "wrong" twice: no retry
    finally:
        server.shutdown()
        server.server_close()
    assert rotated == ("ok", "") and fine == ("ok", "")
    assert unchanged[0] == "lost" and unchanged[1].startswith("401 ")
    assert traffic.rekeyed == 1
