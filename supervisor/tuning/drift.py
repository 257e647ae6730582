"""Drift detection on draft acceptance: a two-sided Page-Hinkley test.

Each observation is the acceptance rate of one metrics delta (the requests that
finished between two scrapes), unweighted, so one long odd request counts once.
Defaults: delta = 0.05 (changes smaller than 5 points of acceptance are noise),
threshold = 1.5 (the cumulative excess over delta that signals a change: a 0.3
step in acceptance is flagged after about 6 observations; one or two odd requests,
however extreme, move the statistic by at most 2 * (1 - delta) and do not), and no
verdict before `min_samples` = 5 observations after a reset.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PageHinkley:
    delta: float = 0.05
    threshold: float = 1.5
    min_samples: int = 5
    n: int = 0
    mean: float = 0.0
    up: float = 0.0  # cumulative evidence of an increase
    down: float = 0.0  # ... and of a decrease

    def reset(self) -> None:
        self.n, self.mean, self.up, self.down = 0, 0.0, 0.0, 0.0

    def building(self) -> bool:
        """Evidence of a change is accumulating (a quarter of the threshold): the latest
        observations may belong to the next regime already."""
        return max(self.up, self.down) > self.threshold / 4

    def update(self, x: float) -> str | None:
        """Add one observation; returns "up" or "down" when a sustained change is detected."""
        self.n += 1
        self.mean += (x - self.mean) / self.n
        self.up = max(0.0, self.up + x - self.mean - self.delta)
        self.down = max(0.0, self.down + self.mean - x - self.delta)
        if self.n < self.min_samples:
            return None
        if self.up > self.threshold:
            return "up"
        if self.down > self.threshold:
            return "down"
        return None


def either_drifted(acceptance: PageHinkley, drafting: PageHinkley,
                   acceptance_rate: float | None,
                   draft_fraction: float | None) -> tuple[str, str] | None:
    """(what drifted, "up" or "down") when the acceptance or the share of steps that carry
    a draft changed for good; both detectors see every observation."""
    found = []
    if acceptance_rate is not None and (d := acceptance.update(acceptance_rate)):
        found.append(("acceptance", d))
    if draft_fraction is not None and (d := drafting.update(draft_fraction)):
        found.append(("the share of steps with a draft", d))
    return found[0] if found else None
