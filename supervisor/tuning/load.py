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
"""

from __future__ import annotations

from collections import deque
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

    def clear(self) -> None:
        for window in self._windows.values():
            window.clear()
        self._busy.clear()

    def add(self, delta: Delta, running: int) -> str:
        """File a delta produced at `running` requests."""
        label = bucket_of(running)
        self._windows[label].add(delta, delta.time)
        return label

    def busy(self, now: float, running: int, interval: float) -> None:
        """The server spent `interval` wall seconds up to `now` with `running` requests.
        Counted whether or not counters moved: llama-server's advance only when a request
        ends, so the tokens of a long request arrive in one delta after several intervals."""
        if running <= 0 or interval <= 0:
            return
        self._busy.append((now, bucket_of(running), interval))
        while self._busy and now - self._busy[0][0] > self.max_age:
            self._busy.popleft()

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
