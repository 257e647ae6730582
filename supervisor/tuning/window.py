"""Acceptance window: counter deltas turned into per-position acceptance and throughput.

The runtime reports cumulative counters; we keep the deltas between scrapes in a
window bounded by verification steps and by age. Two runtime facts shape it:
- counters reset when the server restarts (a new `Process-Start-Time-Unix`, or a
  counter that goes down): the first sample of a new process is all new data;
- llama-server's counters only advance when a request finishes, so a scrape with no
  finished request carries no delta and is skipped, not counted as "zero acceptance".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from supervisor.plugin.backend import MetricsSample
from supervisor.tuning.numbers import rounded


@dataclass(frozen=True)
class Delta:
    """What happened between two scrapes."""

    time: float
    drafts: int  # verification steps that carried a draft
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    tokens: int  # generated tokens
    seconds: float  # time spent generating them (llama-server's per-request clock)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def draft_fraction(self) -> float | None:
        """Share of target steps that carried a draft (None: no step)."""
        steps = self.tokens - self.accepted
        return min(1.0, self.drafts / steps) if steps > 0 else None


@dataclass(frozen=True)
class WindowStats:
    drafts: int
    draft_tokens: int
    accepted: int
    tokens: int
    seconds: float
    per_position_rate: tuple[float, ...]  # p_i = accepted at position i / verification steps
    deltas: int

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def accepted_per_draft(self) -> float | None:
        """Accepted draft tokens per verification step that carried a draft (the sum of p_i);
        the mean accepted length shown to users is 1 + this (tuning/quantities.py)."""
        return self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def steps(self) -> int:
        """Target forward passes: each yields one token of its own plus the accepted drafts."""
        return max(0, self.tokens - self.accepted)

    @property
    def draft_fraction(self) -> float:
        """Share of steps that carried a draft (n-gram methods draft only on a match)."""
        return min(1.0, self.drafts / self.steps) if self.steps else 0.0

    @property
    def mean_draft_size(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None

    def to_dict(self) -> dict[str, object]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted": self.accepted, "tokens": self.tokens,
                "seconds": round(self.seconds, 3),
                "acceptance_rate": rounded(self.acceptance_rate),
                "accepted_per_draft": rounded(self.accepted_per_draft),
                "tokens_per_second": rounded(self.tokens_per_second),
                "draft_fraction": rounded(self.draft_fraction),
                "per_position_rate": [rounded(p) for p in self.per_position_rate]}


def _minus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return tuple(x - y for x, y in zip(a, b, strict=True))


def _plus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return _minus(a, tuple(-x for x in b))


def is_reset(previous: MetricsSample, current: MetricsSample) -> bool:
    if (previous.process_start is not None and current.process_start is not None
            and previous.process_start != current.process_start):
        return True
    return (current.drafts < previous.drafts or current.tokens_predicted < previous.tokens_predicted
            or current.accepted_tokens < previous.accepted_tokens)


def merged(a: Delta | None, b: Delta) -> Delta:
    """`b` with what `a` (the scrapes before it) counted added."""
    if a is None:
        return b
    return Delta(b.time, a.drafts + b.drafts, a.draft_tokens + b.draft_tokens,
                 a.accepted + b.accepted, _plus(a.per_position, b.per_position),
                 a.tokens + b.tokens, a.seconds + b.seconds)


def delta_between(previous: MetricsSample | None, current: MetricsSample, now: float) -> Delta:
    base = MetricsSample() if previous is None or is_reset(previous, current) else previous
    return Delta(
        time=now,
        drafts=current.drafts - base.drafts,
        draft_tokens=current.draft_tokens - base.draft_tokens,
        accepted=current.accepted_tokens - base.accepted_tokens,
        per_position=_minus(current.accepted_per_position, base.accepted_per_position),
        tokens=current.tokens_predicted - base.tokens_predicted,
        seconds=current.tokens_predicted_seconds - base.tokens_predicted_seconds,
    )


class AcceptanceWindow:
    """The most recent deltas, at most `max_steps` verification steps and `max_age` seconds."""

    def __init__(self, max_steps: int = 4000, max_age: float = 3600.0) -> None:
        self.max_steps = max_steps
        self.max_age = max_age
        self._deltas: deque[Delta] = deque()
        self._last: MetricsSample | None = None

    def clear(self) -> None:
        """Forget the evidence (after a configuration change); keep the counter baseline."""
        self._deltas.clear()

    def observe(self, sample: MetricsSample, now: float) -> Delta | None:
        """Add a scrape; returns the new delta, or None if no request finished since the last."""
        delta = delta_between(self._last, sample, now)
        self._last = sample
        if delta.tokens <= 0 and delta.drafts <= 0:
            return None
        self.add(delta, now)
        return delta

    def add(self, delta: Delta, now: float) -> None:
        """Add a delta computed elsewhere (the per-load windows of tuning/load.py)."""
        self._deltas.append(delta)
        self._evict(now)

    def _evict(self, now: float) -> None:
        while len(self._deltas) > 1 and (
                now - self._deltas[0].time > self.max_age
                or sum(d.drafts for d in self._deltas) - self._deltas[0].drafts >= self.max_steps):
            self._deltas.popleft()

    def stats(self, since: float | None = None) -> WindowStats:
        """Over the window, or over what was read from `since` (a time.time()) on."""
        deltas = [d for d in self._deltas if since is None or d.time >= since]
        drafts = sum(d.drafts for d in deltas)
        per_pos: tuple[int, ...] = ()
        for d in deltas:
            per_pos = _plus(per_pos, d.per_position)
        return WindowStats(
            drafts=drafts, draft_tokens=sum(d.draft_tokens for d in deltas),
            accepted=sum(d.accepted for d in deltas),
            tokens=sum(d.tokens for d in deltas),
            seconds=sum(d.seconds for d in deltas),
            per_position_rate=tuple(x / drafts for x in per_pos) if drafts else (),
            deltas=len(deltas))
