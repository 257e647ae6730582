"""Requests the proxy relays to one target: counted in flight, drained, their timings tallied.

The target supervisor owns this book (llama-swap's `Process` owns its in-flight requests
the same way): the proxy enters `relaying()` around each request and never touches a
counter; before a planned restart the owner waits on `drained()`, which wakes when the
last request leaves instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any


class ProxyRequests:
    def __init__(self) -> None:
        self._in_flight = 0
        self._peak = 0  # the most in flight since take_peak() was last called
        # Wall seconds spent at each number of requests in flight since take_busy() was
        # last called: exact, where the runtime's gauges are only seen once per read.
        self._busy: dict[int, float] = {}
        self._level_since = time.monotonic()
        self._idle = asyncio.Event()
        self._idle.set()
        # Which server a request went to: the route changes when a server started beside
        # the old one takes over (supervision/handover.py), and the old one is stopped
        # once the requests of its route are done.
        self.route = 0
        self._on_route: dict[int, int] = {}
        self._route_done: dict[int, asyncio.Event] = {}
        # New requests held until an old route drains (hold_new): the event, the deadline.
        self._hold: tuple[asyncio.Event, float] | None = None
        self.count = 0  # completions whose timings the runtime returned
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.last_used: float | None = None  # wall clock of the last request's start or end
        # Tokens made by the requests that ended since take_classes(), by class
        # (tuning/acceptance.request_class): which text the counters' last interval was.
        self._classes: dict[str, float] = {}

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.asynccontextmanager
    async def relaying(self) -> AsyncIterator[int]:
        """Around one request being relayed to the runtime; gives the route it is on."""
        self._accrue()
        self._in_flight += 1
        self._idle.clear()
        self.last_used = time.time()
        route = self.route
        self._on_route[route] = self._on_route.get(route, 0) + 1
        self._peak = max(self._peak, self._current())
        try:
            yield route
        finally:
            self.last_used = time.time()
            self._accrue()
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
            self._on_route[route] -= 1
            if self._on_route[route] == 0:
                del self._on_route[route]
                if (done := self._route_done.pop(route, None)) is not None:
                    done.set()

    def switch_route(self) -> int:
        """From now on requests go to a new server; returns the old route, for
        `route_drained`. The load and busy time the tuner reads are the new server's from
        here on: requests the old one still finishes are not its evidence."""
        self._accrue()
        old, self.route = self.route, self.route + 1
        self._peak = self._current()
        return old

    def hold_new(self, route: int, timeout: float) -> None:
        """New requests wait in `admitted` until `route` has drained, at most `timeout`
        seconds: where the old and the new server share the same cores, both computing at
        once crawl (the old server's last requests take many times longer while the new one
        serves their clients' next ones)."""
        if route in self._on_route:
            done = self._route_done.setdefault(route, asyncio.Event())
            self._hold = (done, time.monotonic() + timeout)

    async def admitted(self) -> None:
        """Return once a new request may go to the server (at once but during a hold)."""
        while (hold := self._hold) is not None:
            done, deadline = hold
            remaining = deadline - time.monotonic()
            if remaining > 0 and not done.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), remaining)
            if self._hold is hold:  # not replaced by a later switch's hold meanwhile
                self._hold = None

    def _current(self) -> int:
        """Requests in flight on the current route (the server the tuner's counters read)."""
        return self.on_route(self.route)

    def on_route(self, route: int) -> int:
        """Requests in flight on a route."""
        return self._on_route.get(route, 0)

    async def route_drained(self, route: int, timeout: float) -> bool:
        """Wait until no request of `route` is in flight, at most `timeout` seconds."""
        if route not in self._on_route:
            return True
        done = self._route_done.setdefault(route, asyncio.Event())
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def mark(self) -> object:
        """Changes whenever a request starts or ends; while one is in flight, never equal to
        an earlier mark (a fresh object each call)."""
        return object() if self._in_flight else self.last_used

    def take_peak(self) -> int:
        """The most requests in flight at once on the current route since the previous call
        (the load a metrics interval ran at, as the proxy saw it)."""
        peak, self._peak = self._peak, self._current()
        return peak

    def take_busy(self) -> dict[int, float]:
        """Wall seconds spent at each number of requests in flight (1, 2, ...) since the
        previous call."""
        self._accrue()
        busy, self._busy = self._busy, {}
        return busy

    def take_classes(self) -> dict[str, float]:
        """Tokens made by each class of request that ended since the previous call."""
        taken, self._classes = self._classes, {}
        return taken

    def _accrue(self) -> None:
        """Book the time since the last change to the number in flight on the current route
        (after a restart beside, the old server's draining requests ran on other counters:
        booked here, they would make the new server's first window look idle-heavy, its
        throughput a fraction of what it serves)."""
        now = time.monotonic()
        if (current := self._current()) > 0:
            self._busy[current] = self._busy.get(current, 0.0) + (now - self._level_since)
        self._level_since = now

    async def drained(self, timeout: float) -> bool:
        """Wait until no request is in flight, at most `timeout` seconds; whether it got there."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def observe(self, final: Mapping[str, Any], klass: str) -> None:
        """What a completion of class `klass` made, from the object at the end of its
        response: llama.cpp's `timings` (tokens, and the draft counts clients actually
        got, shown beside the runtime's counters) or the OpenAI `usage`."""
        timings = final.get("timings")
        usage = final.get("usage")
        tokens = 0
        if isinstance(timings, Mapping):
            self.count += 1
            self.draft_tokens += int(timings.get("draft_n", 0) or 0)
            self.accepted_tokens += int(timings.get("draft_n_accepted", 0) or 0)
            tokens = int(timings.get("predicted_n", 0) or 0)
        elif isinstance(usage, Mapping):
            tokens = int(usage.get("completion_tokens", 0) or 0)
        if tokens > 0:
            self._classes[klass] = self._classes.get(klass, 0.0) + tokens

    def view(self) -> dict[str, int]:
        return {"count": self.count, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens, "in_flight": self._in_flight}
