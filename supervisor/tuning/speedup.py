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
baseline without) at each length tried gives y = (1 + f*S)/speedup - 1 = f*(a + b*d),
the cost of the drafted steps; with one length measured, c = y/(f*d) (a = 0); with
two or more, a least-squares fit of y/f = a + b*d separates the fixed overhead of
a drafted step (a: draft set-up, a batch instead of a single token) from the cost
per draft token (b). On a CPU the fixed part is large, so a single-point fit
underestimates long drafts; that is why lengths that were measured are compared
by their measured speedup, and the model only ranks lengths not yet tried.
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
    # Judged over the mix of loads (tuning/mix.py), when there is evidence by load; else
    # the speedup is the ratio of per-request speeds.
    mix_speedup: float | None = None
    by_load: dict[str, float] = field(default_factory=dict)  # speedup per load bucket


@dataclass(frozen=True)
class Measurement:
    """The speedup measured at one length, with what it was measured on."""

    speedup: float
    draft_fraction: float
    mean_draft_size: float
    accepted_per_draft: float  # mean accepted tokens per drafted step
    by_load: dict[str, float] = field(default_factory=dict)  # speedup per load bucket

    @property
    def step_cost(self) -> float:
        """a + b*d: the extra cost of one drafted step, in plain steps (from the speedup)."""
        f = self.draft_fraction
        return ((1.0 + f * self.accepted_per_draft) / self.speedup - 1.0) / f if f > 0 else 0.0


@dataclass(frozen=True)
class Choice:
    """The tuner's answer: the best length (None: speculation off) and its reasons."""

    length: int | None
    predicted_speedup: float  # of the choice, against speculation off
    current_speedup: float  # measured, at the current length
    draft_cost: float
    decay: float
    predictions: dict[int, float] = field(default_factory=dict)
    overhead: float = 0.0  # a: fixed cost of a drafted step (0 until two lengths are measured)
    model_best: int | None = None  # the best length the model alone would pick
    # With one length measured: twice it, and its speedup if a drafted step's cost were all
    # fixed (the optimistic end of what one point allows; see `probe`).
    probe: int | None = None
    probe_speedup: float | None = None

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


def measurement(ev: Evidence) -> Measurement:
    speedup = (ev.mix_speedup if ev.mix_speedup is not None
               else ev.tokens_per_second / ev.baseline_tokens_per_second)
    return Measurement(speedup, ev.draft_fraction, ev.mean_draft_size,
                       sum(ev.per_position_rate[:ev.length]), dict(ev.by_load))


def _usable(points: list[Measurement]) -> list[tuple[float, float]]:
    return [(m.mean_draft_size, m.step_cost) for m in points
            if m.draft_fraction > 0 and m.mean_draft_size > 0]


def split_of(points: list[Measurement]) -> tuple[float, float] | None:
    """(a, b) when the points fit both a fixed and a per-token cost (two draft sizes or
    more, both parts positive); None when they cannot tell them apart."""
    if len({round(d, 3) for d, _ in _usable(points)}) < 2:
        return None
    a, b = fit_cost(points)
    return (a, b) if a > 0 and b > 0 else None


def fit_cost(points: list[Measurement],
             prior: tuple[float, float] | None = None) -> tuple[float, float]:
    """(a, b) with a + b*d = step cost, least squares over lengths measured; both >= 0.
    With one draft size measured, `prior` (an earlier two-size fit) gives the split of the
    measured cost into its fixed and per-token parts; without one, all of it is per token."""
    usable = _usable(points)
    if not usable:
        return 0.0, 0.0
    sizes = {round(d, 3) for d, _ in usable}
    if len(sizes) < 2:
        d, y = usable[-1]
        if prior is not None and prior[0] + prior[1] * d > 0:
            scale = max(0.0, y) / (prior[0] + prior[1] * d)
            return prior[0] * scale, prior[1] * scale
        return 0.0, max(0.0, y / d)
    n = len(usable)
    mean_d = sum(d for d, _ in usable) / n
    mean_y = sum(y for _, y in usable) / n
    b = (sum((d - mean_d) * (y - mean_y) for d, y in usable)
         / sum((d - mean_d) ** 2 for d, _ in usable))
    a = mean_y - b * mean_d
    if b < 0:  # noise: fall back to a pure per-token cost
        return 0.0, max(0.0, mean_y / mean_d)
    if a < 0:
        return 0.0, max(0.0, sum(y * d for d, y in usable) / sum(d * d for d, _ in usable))
    return a, b


def predict_speedup(ev: Evidence, length: int, cost: float, decay: float,
                    overhead: float = 0.0) -> float:
    # Drafts fill the same share of the allowed length as they do now (1.0 for draft models).
    fill = ev.mean_draft_size / ev.length if ev.length else 1.0
    f = ev.draft_fraction
    accepted = f * expected_accepted(ev.per_position_rate, length, decay)
    return (1.0 + accepted) / (1.0 + f * (overhead + cost * fill * length))


def choose(ev: Evidence, low: int, high: int, off_margin: float,
           measured: dict[int, Measurement] | None = None,
           search_limit: int | None = None, try_margin: float = 0.0,
           prior: tuple[float, float] | None = None) -> Choice:
    """The best length within [low, high], or None if none beats speculation off by the margin.

    `measured` holds speedups measured earlier at other lengths (same workload regime);
    they take precedence over predictions, and together they fit the cost model. Once
    `search_limit` lengths have been measured, only they are candidates: each one tried cost
    a restart, and on noisy windows a model refitted at every point keeps finding a new
    "best" length (run 7 of benchmarks/tuner_phases.py: eight retunes in one workload).
    A length not yet measured is a candidate only if it is predicted to beat the best
    measured one by `try_margin`: trying it costs a restart, and a prediction that a
    known length nearly matches is not worth one (run 8: 33 tried, predicted 2.55x, with
    48 measured at 2.47x).
    `prior`: the split (a, b) of a drafted step's cost fitted earlier on two draft sizes,
    for when this regime has one: the split is the runtime's and the machine's, not the
    text's, and without it one point at a long length predicts any shorter length far
    better than it is (run 8: 48 -> 17 predicted 3.12x from 2.47x, measured 2.37x).
    """
    measured = {**(measured or {}), ev.length: measurement(ev)}
    decay = fit_decay(ev.per_position_rate)
    overhead, cost = fit_cost(list(measured.values()), prior)
    current = measured[ev.length].speedup
    lengths = range(max(1, low), high + 1)
    model = {k: predict_speedup(ev, k, cost, decay, overhead) for k in lengths}
    predictions = {k: measured[k].speedup if k in measured
                   else _anchored(ev, k, model[k], measured, cost, decay, overhead)
                   for k in lengths}
    known = max(m.speedup for m in measured.values())
    limited = search_limit is not None and len(measured) >= search_limit
    # Acceptance past twice the longest length that ran is the decay fit alone: from a short
    # draft accepted in full it is 1.0 at every position, and the model then takes the
    # longest length allowed (run 16 of tuner_phases: 2 -> 64 predicted 1.25x on code, where
    # 16 is best; run 15: 11 -> 32 predicted +25 %, measured 0.71x). A longer length is
    # reached a doubling at a time, each one measured.
    reach = 2 * max(measured)
    candidates = {k: v for k, v in predictions.items() if k in measured
                  or (not limited and k <= reach and v >= known * (1.0 + try_margin))}
    if limited:
        predictions = candidates or predictions
    # Ties go to the shorter length: it wastes less when acceptance drops.
    def best_of(table: dict[int, float]) -> int:
        return max(table, key=lambda k: (round(table[k], 6), -k))
    # Speculation stays on while any length is predicted to pay; the one run is the best
    # candidate (none: nothing measured lies within the bounds, they were narrowed).
    best = best_of(candidates or {k: v for k, v in predictions.items() if k <= reach}
                   or predictions)
    model_best = best_of(model)
    probe, probe_speedup = _probe(ev, measured, high, decay) if prior is None else (None, None)
    if max(predictions.values()) < 1.0 + off_margin:
        return Choice(None, 1.0, current, cost, decay, predictions, overhead, model_best,
                      probe, probe_speedup)
    return Choice(best, predictions[best], current, cost, decay, predictions, overhead,
                  model_best, probe, probe_speedup)


def _anchored(ev: Evidence, length: int, modelled: float, measured: dict[int, Measurement],
              cost: float, decay: float, overhead: float) -> float:
    """The model's speedup at an unmeasured length, scaled by how far the model missed at the
    nearest measured length: the curve passes through what was measured. Without it, a
    length next to a measured one (47 beside 48) could be predicted well above what 48
    measured, because the acceptance profile of this window is not the one 48 ran on."""
    nearest = min(measured, key=lambda k: (abs(k - length), k))
    at_nearest = predict_speedup(ev, nearest, cost, decay, overhead)
    return modelled * measured[nearest].speedup / at_nearest if at_nearest > 0 else modelled


def _probe(ev: Evidence, measured: dict[int, Measurement], high: int,
           decay: float) -> tuple[int | None, float | None]:
    """Twice the current length, and its speedup if a drafted step cost a fixed amount
    whatever its size.

    One measured length fixes the cost of a drafted step, a + b*d, but not how it splits
    into a fixed part a and a per-token part b; the model then takes it all as per-token
    (a = 0), which is the pessimistic end for longer drafts. On this CPU the truth is far
    from it for n-gram drafts (verifying 32 tokens costs little more than 16: ngram-mod
    measured 1.17x faster at n-max 32 than at 16 on code, where the one-point model
    predicted +1 % at best). The other end, all fixed (b = 0), bounds what a longer draft
    can give; `decisions.evaluate` measures the probe when even that is worth less than a
    retune would need, it does not."""
    if len(measured) != 1 or 2 * ev.length > high or ev.draft_fraction <= 0:
        return None, None
    fixed = measured[ev.length].step_cost
    probe = 2 * ev.length
    return probe, predict_speedup(ev, probe, 0.0, decay, overhead=fixed)
