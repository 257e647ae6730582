"""soak.py's traffic: clients that send mixed requests through the proxy back to back, and
each request's outcome classified against the soak's first invariant, "every request gets
an answer" (docs/reliability.md, "The soak").

Outcomes:
  ok          200 with the whole answer (a stream up to `data: [DONE]`)
  refused     502 or 503 with a JSON reason (the target cannot serve within proxy.hold)
  abandoned   a stream the client itself closed mid-way (on purpose: a client that leaves)
  cut_stream  a stream that had started and was cut (a runtime or the daemon died under it)
  daemon_down a connection refused while the fault schedule had the daemon down
  rekeyed     (counted beside the outcome) a 401 for a key that was rotated between the
              client's reading it and the daemon's check: the client reads the key again
              and sends the request once more, as one with a credentials file does
  lost        a violation: no response at all (a reset, a refused connection while the
              daemon ran), a hang past proxy.hold plus a margin, or any other status
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

KINDS = ("completion", "chat", "stream_completion", "stream_chat", "leave_mid_stream")
PROMPTS = ("Write a short note about {n} lighthouses.", "def area_{n}(w, h):\n",
           "List {n} colours, one per line:\n", "Translate 'good morning {n}' into French:")


class Traffic:
    """`clients` threads; the number of clients sending at once follows `active()` (1 to
    `clients`), so the load moves between one and several clients. `key` reads the
    inference key (from its file) for each request; None: the proxy wants no key."""

    def __init__(self, host: str, port: int, targets: list[str], clients: int, hold: float,
                 seed: int, daemon_up: threading.Event,
                 key: Callable[[], str] | None = None) -> None:
        self.host, self.port, self.targets = host, port, targets
        self.key = key
        self.rekeyed = 0  # requests sent again with a rotated key (not an outcome)
        self.hold = hold
        self.daemon_up = daemon_up
        self.counts: Counter[str] = Counter()
        self.by_target: dict[str, Counter[str]] = {t: Counter() for t in targets}
        self.lost: list[dict[str, Any]] = []  # the violations, with what was seen
        # the refusals' reasons too: a 503 is allowed, but which reason it gave tells
        # whether the daemon refused for a cause a reader of the result would accept
        self.refused: list[dict[str, Any]] = []
        self.active = clients
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rand = [random.Random(seed * 1000 + i) for i in range(clients)]
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True,
                                          name=f"soak-client-{i}") for i in range(clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.hold + 120)

    def _client(self, i: int) -> None:
        rand, n = self._rand[i], 0
        while not self._stop.is_set():
            if i >= self.active:
                time.sleep(0.5)
                continue
            n += 1
            target, kind = rand.choice(self.targets), rand.choice(KINDS)
            prompt = rand.choice(PROMPTS).format(n=f"{i}-{n}")
            outcome, detail = self.one(target, kind, prompt, rand.randint(8, 40))
            if outcome == "daemon_down":
                time.sleep(0.5)  # as a client would retry: not a loop of refused connects
            with self._lock:
                self.counts[outcome] += 1
                self.by_target[target][outcome] += 1
                kept = {"lost": self.lost, "refused": self.refused}.get(outcome)
                if kept is not None:
                    kept.append({"time": time.time(), "target": target, "kind": kind,
                                 "detail": detail})

    def one(self, target: str, kind: str, prompt: str, max_tokens: int) -> tuple[str, str]:
        key = self.key() if self.key else None
        outcome, detail = self._send(target, kind, prompt, max_tokens, key)
        if outcome == "lost" and detail.startswith("401 ") and self.key is not None \
                and (fresh := self.key()) != key:
            with self._lock:
                self.rekeyed += 1
            outcome, detail = self._send(target, kind, prompt, max_tokens, fresh)
        return outcome, detail

    def _send(self, target: str, kind: str, prompt: str, max_tokens: int,
              key: str | None) -> tuple[str, str]:
        chat = "chat" in kind
        stream = kind.startswith("stream") or kind == "leave_mid_stream"
        body: dict[str, Any] = {"model": target, "max_tokens": max_tokens, "temperature": 0.7,
                                "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if chat else "/v1/completions"
        was_up = self.daemon_up.is_set()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.hold + 60)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        try:
            conn.request("POST", path, json.dumps(body), headers)
            resp = conn.getresponse()
            if resp.status != 200:
                text = resp.read().decode(errors="replace")
                ok_reason = resp.status in (502, 503) and _has_reason(text)
                return ("refused", text[:300]) if ok_reason else (
                    "lost", f"{resp.status} {text[:300]}")
            if not stream:
                data = json.loads(resp.read())
                return ("ok", "") if data.get("choices") else ("lost", "200 without choices")
            return self._stream(resp, leave=kind == "leave_mid_stream")
        except TimeoutError:
            return "lost", f"no answer within {self.hold + 60:g}s (a hang)"
        except ConnectionRefusedError:
            if not was_up or not self.daemon_up.is_set():
                return "daemon_down", ""
            return "lost", "connection refused while the daemon ran"
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            if not was_up or not self.daemon_up.is_set():
                return "daemon_down", repr(exc)
            return "lost", repr(exc)
        finally:
            conn.close()

    def _stream(self, resp: http.client.HTTPResponse, leave: bool) -> tuple[str, str]:
        events = 0
        try:
            for raw in resp:
                line = raw.strip()
                if line == b"data: [DONE]":
                    return "ok", ""
                if line.startswith(b"data: "):
                    events += 1
                    if leave and events >= 3:
                        return "abandoned", ""
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            return "cut_stream", repr(exc)
        return "cut_stream", f"ended after {events} events without [DONE]"


def _has_reason(text: str) -> bool:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return bool(error)
