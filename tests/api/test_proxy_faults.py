"""The proxy when runtimes fail, with the real llama-server: a target that will not come back
is refused at once; a request whose server dies before answering is resent once; a stream
that had started is cut, not replayed (docs/api.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import llama_target, wait_for, write_fleet


def proxy_of(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]


def post(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_request_for_a_failed_target_gets_503_at_once_with_the_reason(
        tmp_path, llama_server_bin, start_daemon):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF this is not a model" * 100)
    fleet = write_fleet(tmp_path, {"broken": llama_target(str(bad), llama_server_bin)})
    doc = yaml.safe_load(fleet.read_text())
    doc["daemon"]["proxy"]["hold"] = "1h"  # waiting for it would outlast the client's timeout
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon = start_daemon(fleet)
    daemon.wait_state("broken", "failed", 60)
    status, body = post(f"{proxy_of(fleet)}/v1/completions",
                        {"model": "broken", "prompt": "hi", "max_tokens": 4}, timeout=60)
    assert status == 503
    message = json.loads(body)["error"]
    assert message.startswith("target 'broken' is failed:") and "not restarting" in message
    assert "/v1/targets/broken/restart" in message


LONG = {"prompt": "Count from one to one thousand in words: one, two,", "max_tokens": 600,
        "temperature": 0, "ignore_eos": True}


def kill_after_first_tokens(daemon: Any, name: str, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        os.kill(daemon.target(name)["pid"], signal.SIGKILL)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_non_streamed_completion_whose_server_dies_is_resent_once_and_answered(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    first_pid = daemon.wait_state("t", "ready")["pid"]
    killer = kill_after_first_tokens(daemon, "t", 1.0)
    status, body = post(f"{proxy_of(fleet)}/v1/completions", {"model": "t", **LONG})
    killer.join()
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 600
    assert daemon.target("t")["pid"] != first_pid  # answered by the restarted server
    assert daemon.target("t")["restarts"] == 1


def test_a_non_streamed_completion_dropped_twice_gets_502(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "ready")

    def ready_pid(restarts: int) -> int | None:
        t = daemon.target("t")
        return t["pid"] if t.get("state") == "ready" and t.get("restarts") == restarts else None

    def kill_twice() -> None:
        for restarts in (0, 1):
            pid = wait_for(lambda r=restarts: ready_pid(r), 60, "ready")
            time.sleep(1.0)
            os.kill(pid, signal.SIGKILL)
    killer = threading.Thread(target=kill_twice)
    killer.start()
    status, body = post(f"{proxy_of(fleet)}/v1/completions", {"model": "t", **LONG})
    killer.join()
    assert status == 502
    assert "dropped the request without an answer twice" in json.loads(body)["error"]


def test_a_stream_whose_server_dies_is_cut_not_replayed(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "ready")
    killer = kill_after_first_tokens(daemon, "t", 1.0)
    req = urllib.request.Request(f"{proxy_of(fleet)}/v1/completions",
                                 data=json.dumps({"model": "t", "stream": True, **LONG}).encode(),
                                 headers={"Content-Type": "application/json"})
    received = b""
    error: Exception | None = None
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
            while chunk := resp.read1(65536):
                received += chunk
    except Exception as exc:  # the connection closed mid-response: what a client should see
        error = exc
    killer.join()
    assert b"data: " in received  # part of the stream had arrived
    assert b"[DONE]" not in received  # and it did not look complete
    assert error is not None, "a cut stream must not end like a complete response"
    daemon.wait_state("t", "ready")
    assert daemon.target("t")["requests"]["count"] == 0  # nothing was resent and answered


def test_streams_closed_by_their_clients_right_after_done_are_counted_without_a_traceback(
        tmp_path, model, llama_server_bin, start_daemon):
    """A client that closes (a reset, SO_LINGER 0) as soon as it has `data: [DONE]`, before
    the chunked body's end: the proxy wrote the end into a closed connection and raised
    outside its relay loop (a traceback, the request missing from the counts; 2 of 180 in
    issue 30's run). Whether the reset lands before the proxy writes the end is a race, so
    180 requests are sent from 6 threads; each must be counted (without the fix: 177 counted
    and one left in flight, in each of two tries here; 40 streams one at a time: none hit)."""
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "ready")
    host, port = proxy_of(fleet)[len("http://"):].rsplit(":", 1)
    body = json.dumps({"model": "t", "prompt": "Hello", "max_tokens": 4, "stream": True})
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n")

    def closer(rounds: int) -> None:
        for _ in range(rounds):
            with socket.create_connection((host, int(port)), timeout=60) as sock:
                sock.sendall((head + body).encode())
                received = b""
                while b"data: [DONE]" not in received and (chunk := sock.recv(65536)):
                    received += chunk
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    # Beside plain streams, as in the run that found it: a busy proxy widens the race.
    rounds, threads = 30, 4
    workers = [threading.Thread(target=closer, args=(rounds,)) for _ in range(threads)]
    plain = {"model": "t", "prompt": "Hello", "max_tokens": 4}
    workers += [threading.Thread(target=lambda: [post(f"{proxy_of(fleet)}/v1/completions", plain)
                                                 for _ in range(rounds)]) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sent = rounds * (threads + 2)
    wait_for(lambda: daemon.target("t").get("requests", {}).get("count") == sent, 30,
             f"{sent} requests counted (now {daemon.target('t').get('requests')})")
    log = daemon.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log and "Cannot write to closing transport" not in log, log[-3000:]


def test_a_planned_daemon_stop_lets_the_requests_under_way_finish_and_refuses_new_ones(
        tmp_path, model, llama_server_bin, start_daemon):
    # Issue 30: SIGTERM (an upgrade, `systemctl restart`) stopped the targets first, cutting
    # what the proxy was relaying.
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "ready")
    answers: list[tuple[int, bytes]] = []
    body = {"model": "t", **LONG, "max_tokens": 150}
    thread = threading.Thread(target=lambda: answers.append(
        post(f"{proxy_of(fleet)}/v1/completions", body)), daemon=True)
    thread.start()
    wait_for(lambda: daemon.target("t")["requests"]["in_flight"] == 1, 30, "the request under way")
    daemon.signal(signal.SIGTERM)
    host, port = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"].split(":")
    refused = wait_for(lambda: _refused(host, int(port)), 10, "new connections refused")
    thread.join(120)
    assert refused
    assert answers and answers[0][0] == 200, answers
    assert json.loads(answers[0][1])["usage"]["completion_tokens"] == 150
    assert daemon.proc.wait(60) == 0
    said = [e["reason"] for e in daemon.events("-")]
    assert "stopping: 1 proxy request(s) under way finished" in said, said[-5:]


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False
