"""Evidence by load: the acceptance window kept per concurrency bucket.

Speculation pays when one request has the server to itself and can cost when many share
it (a verification step of a batch is dearer, and drafts compete with other requests for
the same compute), so evidence gathered at one concurrency says little about another.
Each delta between two scrapes is filed under the load it was produced at: the most
requests that were running at either end of the interval by the runtime's own gauge
(llama.cpp's requests processing, `vllm:num_requests_running`), or in flight through
specfleet's proxy since the previous scrape, whichever saw more. The maximum, not the
mean: a request that finished between the scrapes still ran beside the others.

Besides the window, each bucket keeps the wall time the server spent busy at that load,
so a decision can weigh the buckets by how the time is really spent, and the throughput
of the server as a whole at that load (tokens per busy second, all requests together),
which is what a shared server is judged by; the window's tokens/s is per request.
Busy time is booked when tokens arrive: llama-server's counters move only when a request
ends, so the seconds of a request still running belong to tokens not yet counted. Booked
at once, a window of one or two requests (a quick judgement after a restart) counts the
next request's time against the last one's tokens: a length read as far slower by
throughput than its tokens/s says.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.tuning.window import AcceptanceWindow, Delta, WindowStats

# (lowest, highest or None, label): 1, 2-3, 4-7, 8+ requests running.
BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 1, "1"), (2, 3, "2-3"), (4, 7, "4-7"), (8, None, "8+"))
LABELS = tuple(label for _, _, label in BUCKETS)


def bucket_of(running: int) -> str:
    """The bucket of a load; an interval that produced tokens had at least one request."""
    running = max(1, running)
    for low, high, label in BUCKETS:
        if running >= low and (high is None or running <= high):
            return label
    raise AssertionError(running)  # BUCKETS cover every integer >= 1


@dataclass(frozen=True)
class LoadStats:
    window: WindowStats
    busy_seconds: float  # wall time the server spent at this load, within the window's age

    @property
    def throughput(self) -> float | None:
        """Tokens per busy second, all requests together."""
        return self.window.tokens / self.busy_seconds if self.busy_seconds > 0 else None


class LoadWindows:
    """One acceptance window per bucket, and the busy time per bucket."""

    def __init__(self, max_steps: int = 4000, max_age: float = 3600.0) -> None:
        self.max_age = max_age
        self._windows = {label: AcceptanceWindow(max_steps, max_age) for label in LABELS}
        self._busy: deque[tuple[float, str, float]] = deque()  # (time, bucket, seconds)
        self._unbooked: deque[tuple[float, str, float]] = deque()  # busy since the last tokens
        self.last_read: tuple[float, int] | None = None  # (time, requests running)

    def restarted(self) -> None:
        """A server (re)started: the time it was down is no load."""
        self.last_read = None

    def clear(self) -> None:
        for window in self._windows.values():
            window.clear()
        self._busy.clear()
        self._unbooked.clear()

    def add(self, delta: Delta, running: int) -> str:
        """File a delta produced at `running` requests, and book the busy time up to it."""
        label = bucket_of(running)
        self._windows[label].add(delta, delta.time)
        if delta.tokens > 0:
            self._busy.extend(self._unbooked)
            self._unbooked.clear()
        return label

    def read(self, now: float, processing: int, delta: Delta | None, proxy_peak: int,
             proxy_busy: Mapping[int, float]) -> None:
        """A metrics read: the runtime's gauge of requests running, the delta since the last
        read (None: no counter moved), and what the proxy saw meanwhile (the most requests in
        flight, and the seconds at each number in flight)."""
        last_time, last_running = self.last_read or (now, 0)
        running = max(last_running, processing, proxy_peak)
        busy = now - last_time
        if proxy_busy and max(last_running, processing) <= proxy_peak:
            # The proxy saw every request the runtime's gauges show: its clock is exact,
            # where a request seen running at one read books the whole interval either
            # side (a 1 s request between reads 1 s apart counted 2 s: sparse traffic, and
            # short fast requests most, looked up to half as fast as it was). Booked under
            # the interval's load like its tokens, so a bucket's throughput stays tokens
            # and time of the same intervals.
            busy = min(busy, sum(proxy_busy.values()))
        self.busy(now, running, busy)
        if delta is not None:
            self.add(delta, running)
        self.last_read = (now, processing)

    def quiet(self, now: float) -> None:
        """A read skipped because the runtime did nothing (supervision/probes.py): the
        interval since the last read is filed as the previous read saw it, and the next
        starts idle, as a read showing no request running would have."""
        last_time, last_running = self.last_read or (now, 0)
        self.busy(now, last_running, now - last_time)
        self.last_read = (now, 0)

    def busy(self, now: float, running: int, interval: float) -> None:
        """The server spent `interval` wall seconds up to `now` with `running` requests.
        Counted whether or not counters moved (the tokens of a long request arrive in one
        delta after several intervals), and booked with the next delta that has tokens."""
        if running <= 0 or interval <= 0:
            return
        self._unbooked.append((now, bucket_of(running), interval))
        for booked in (self._busy, self._unbooked):
            while booked and now - booked[0][0] > self.max_age:
                booked.popleft()

    def stats(self) -> dict[str, LoadStats]:
        """The buckets that hold evidence, lowest load first."""
        busy = dict.fromkeys(LABELS, 0.0)
        for _, label, seconds in self._busy:
            busy[label] += seconds
        out = {}
        for label in LABELS:
            stats = self._windows[label].stats()
            if stats.deltas:
                out[label] = LoadStats(stats, busy[label])
        return out

    def view(self) -> dict[str, dict[str, object]]:
        """Per bucket, for status and the API: the window's numbers, the whole server's
        throughput, and the share of busy time spent at that load."""
        stats = self.stats()
        total = sum(s.busy_seconds for s in stats.values())
        return {label: {**s.window.to_dict(),
                        "throughput": None if s.throughput is None else round(s.throughput, 2),
                        "busy_seconds": round(s.busy_seconds, 1),
                        "time_share": round(s.busy_seconds / total, 4) if total else None}
                for label, s in stats.items()}
