"""The requests' sampling as a workload signal: a change the tuner sees before any token.

How often a draft is accepted depends on the text and on how the target samples it: at
temperature 0 the target picks its most likely token, which a good draft predicted; at 0.8
it often picks another (the draft-model pair of `specfleet setup --pair`: 1.2-1.7x off at
temperature 0, 0.2-0.3x on prose at 0.8, benchmarks/README.md). The proxy reads each
request's `temperature`, so a change in the share of greedy requests is a change of
workload that shows on the first requests after it, and shows while speculation is off,
when there is no acceptance to watch: the one time the tuner is otherwise blind until its
next re-probe (run 14 of tuner_phases served a whole code phase off, waiting out a re-probe
interval doubled in prose).

Each request counts 1 (greedy) or 0 (sampled) in a two-sided Page-Hinkley test, with a
tolerance and threshold for a 0/1 signal: a switch from all-sampled to all-greedy fires
after 5 requests (6 where the old workload had only 20), from half-and-half to all-greedy
on the 16th, so a random half-and-half mix needs 16 of one kind in a row to fire
(once in tens of thousands of requests; a false change costs a re-evaluation, not the
setting). Requests without a `temperature` (the runtime's default) and requests that did
not pass through the proxy do not count. The share of greedy requests since the last
change identifies a workload regime for its return (tuning/regimes.py).
Pure apart from the counts it is fed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.tuning.drift import PageHinkley
from supervisor.tuning.numbers import rounded

# At or under this temperature a request is greedy: llama.cpp and vLLM take the most likely
# token at 0, and 0.05 is as good as greedy for what a draft can predict.
GREEDY_TEMPERATURE = 0.05
GREEDY, SAMPLED = "greedy", "sampled"


def sampling_class(body: Mapping[str, Any]) -> str | None:
    """GREEDY or SAMPLED by the request's `temperature`; None when it has none (or not a
    number): the runtime's default, which specfleet does not know for every model."""
    t = body.get("temperature")
    if isinstance(t, bool) or not isinstance(t, int | float):
        return None
    return GREEDY if t <= GREEDY_TEMPERATURE else SAMPLED


def interleaved(greedy: int, sampled: int) -> list[float]:
    """The requests of one interval as 0/1 observations, alternating: their order within
    the interval is not known, and alternating invents no run of one kind."""
    both = min(greedy, sampled)
    return [1.0, 0.0] * both + [1.0] * (greedy - both) + [0.0] * (sampled - both)


@dataclass
class SamplingWatch:
    """The share of greedy requests and the detector of its changes."""

    detector: PageHinkley = field(
        default_factory=lambda: PageHinkley(delta=0.3, threshold=3.0, min_samples=5))
    # The latest requests: at a change they are the new workload's first, and seed it.
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    left_share: float | None = None  # the share of the workload the last change left
    count: int = 0  # the requests observed, ever: the tuner dates its own changes by them
    # The latest unbroken run of one kind: its value and how many requests it has.
    run_value: float | None = None
    run_length: int = 0
    # At a change: the number of the new workload's first request (`count` when it came),
    # estimated as the start of the latest run of the new kind; None before any change.
    onset: int | None = None

    @property
    def share(self) -> float | None:
        """The share of greedy requests since the last change, None before any."""
        return self.detector.mean if self.detector.n else None

    def observe(self, greedy: int, sampled: int) -> str | None:
        """Add the requests of one interval; "up" or "down" when the share of greedy requests
        changed for good. The watch then starts over on the new workload from its latest
        requests, `left_share` is the old one's share without them, and `onset` the
        number of the new workload's first request (by `count`)."""
        for x in interleaved(greedy, sampled):
            self.recent.append(x)
            self.count += 1
            self.run_length = self.run_length + 1 if x == self.run_value else 1
            self.run_value = x
            if direction := self.detector.update(x):
                d, seeds = self.detector, list(self.recent)
                # The new kind's run, or the seeds where the run is of the other kind.
                new = 1.0 if direction == "up" else 0.0
                self.onset = self.count - (self.run_length if x == new else len(seeds)) + 1
                old = d.n - len(seeds)
                self.left_share = (d.mean * d.n - sum(seeds)) / old if old > 0 else None
                d.reset()
                for seed in seeds:
                    d.update(seed)
                return direction
        return None

    def view(self) -> dict[str, float | None]:
        """For events: the share now and the share the last change left."""
        return {"greedy_share": rounded(self.share, 4), "left_greedy_share": rounded(self.left_share, 4)}
