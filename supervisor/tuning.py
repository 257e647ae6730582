"""Draft-length tuning math: pure functions of measured acceptance and throughput.

The model (docs/tuning.md has the derivation). One target forward pass ("step")
yields one token of its own plus the draft tokens accepted in it. With
  f    = share of steps that carry a draft (1 for draft models; n-gram methods draft
         only when the context has a match),
  p_i  = probability that draft position i is accepted (accepted at i / steps with a draft),
  d(k) = draft tokens per drafted step at length k,
  c    = cost of one draft token (drafting plus verifying it) relative to one plain step,
the speedup over no speculation at draft length k is

    speedup(k) = (1 + f * sum_{i<k} p_i) / (1 + c * f * d(k)).

p_i is measured for positions the server ran; beyond the current length it is
extrapolated with a geometric decay fitted to the measured positions. c is not
guessed: the measured speedup (tokens/s with speculation over the measured
baseline without) at the current length gives it by solving the same equation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Evidence:
    """What the acceptance window measured at the current setting."""

    length: int  # the draft length in effect
    per_position_rate: tuple[float, ...]
    draft_fraction: float
    mean_draft_size: float
    tokens_per_second: float
    baseline_tokens_per_second: float


@dataclass(frozen=True)
class Choice:
    """The tuner's answer: the best length (None: speculation off) and its reasons."""

    length: int | None
    predicted_speedup: float  # of the choice, against speculation off
    current_speedup: float  # measured, at the current length
    draft_cost: float
    decay: float
    predictions: dict[int, float] = field(default_factory=dict)

    @property
    def gain(self) -> float:
        """Predicted throughput of the choice relative to the current setting, minus 1."""
        return (max(self.predicted_speedup, 1.0) if self.length is None
                else self.predicted_speedup) / self.current_speedup - 1.0


def fit_decay(rates: tuple[float, ...]) -> float:
    """Ratio r of a geometric fit p_i ~ p_0 * r**i (least squares on log p), in [0, 1]."""
    points = [(i, math.log(p)) for i, p in enumerate(rates) if p > 0]
    if len(points) < 2:
        # One position measured: assume each further position is accepted as often as the
        # first one was, squared off (p_1 ~ p_0**2 under independent acceptance).
        return min(max(rates[0], 0.0), 1.0) if rates else 0.0
    n = len(points)
    mean_i = sum(i for i, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((i - mean_i) ** 2 for i, _ in points)
    slope = sum((i - mean_i) * (y - mean_y) for i, y in points) / var
    return min(max(math.exp(slope), 0.0), 1.0)


def expected_accepted(rates: tuple[float, ...], length: int, decay: float) -> float:
    """Mean accepted draft tokens per drafted step at `length`: sum of p_i, extrapolated."""
    total = sum(rates[:length])
    last = rates[-1] if rates else 0.0
    for _ in range(len(rates), length):
        last *= decay
        total += last
    return total


def draft_cost(ev: Evidence, decay: float) -> float:
    """c from the measured speedup at the current length (clamped at 0 against noise)."""
    fd = ev.draft_fraction * ev.mean_draft_size
    if fd <= 0 or ev.tokens_per_second <= 0:
        return 0.0
    measured = ev.tokens_per_second / ev.baseline_tokens_per_second
    accepted = ev.draft_fraction * expected_accepted(ev.per_position_rate, ev.length, decay)
    return max(0.0, ((1.0 + accepted) / measured - 1.0) / fd)


def predict_speedup(ev: Evidence, length: int, cost: float, decay: float) -> float:
    # Drafts fill the same share of the allowed length as they do now (1.0 for draft models).
    fill = ev.mean_draft_size / ev.length if ev.length else 1.0
    accepted = ev.draft_fraction * expected_accepted(ev.per_position_rate, length, decay)
    return (1.0 + accepted) / (1.0 + cost * ev.draft_fraction * fill * length)


def choose(ev: Evidence, low: int, high: int, off_margin: float) -> Choice:
    """The best length within [low, high], or None if none beats speculation off by the margin."""
    decay = fit_decay(ev.per_position_rate)
    cost = draft_cost(ev, decay)
    current = ev.tokens_per_second / ev.baseline_tokens_per_second
    predictions = {k: predict_speedup(ev, k, cost, decay) for k in range(max(1, low), high + 1)}
    # Ties go to the shorter length: it wastes less when acceptance drops.
    best = max(predictions, key=lambda k: (round(predictions[k], 6), -k))
    if predictions[best] < 1.0 + off_margin:
        return Choice(None, 1.0, current, cost, decay, predictions)
    return Choice(best, predictions[best], current, cost, decay, predictions)
