"""Decisions by load: a speedup judged over the mix of loads the server really sees.

A llama-server runs one speculation setting for all requests, so the best setting is the
one with the best throughput over the observed mix of concurrency buckets, not the one
that wins for a lone request. Measured here (benchmarks/load_phases.py, llama-server,
gemma-3-270m, repetitive code): ngram-mod n-max 64 is 2.7x speculation off with one client
and 0.97x with eight, n-max 16 is 2.1x and 1.20x.

Per bucket b, the server's throughput (tokens per busy second, all requests together) with
the current setting and without speculation (measured in the baseline run) give the
bucket's speedup s_b. The buckets are weighted by the time they take without speculation,
w_b = (tokens_b / throughput_off_b) / sum; the same tokens at each load then take
sum(w_b / s_b) of that time with speculation, so the speedup over the mix is

    S = 1 / sum_b (w_b / s_b).

Tokens per bucket are the window's: the work done at each load, the same whichever
setting serves it. A bucket without a baseline (no load of that kind during the baseline
run) has no speedup; when the buckets that have one hold less than half of the window's
tokens there is no judgement by load at all, and the caller falls back to the overall
ratio of per-request speeds. Lengths measured earlier are re-weighted on today's mix.
All functions are pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.tuning.load import BUCKETS, LABELS, LoadStats
from supervisor.tuning.speedup import Measurement

# A bucket's throughput is evidence once it holds this share of the tuning min_tokens: a
# tenth, so that a load that takes a small share of the tokens (one client between bursts
# of eight: a fifth of the tokens in benchmarks/load_mix.py) still counts.
BUCKET_EVIDENCE = 0.1
COVERAGE = 0.5  # the buckets with a speedup must hold at least this share of the tokens

# Per bucket: (tokens in the window, server throughput); plain values, kept in tuning.json.
Summary = Mapping[str, tuple[int, float]]


@dataclass(frozen=True)
class MixJudgement:
    """The current setting judged over the observed mix of loads."""

    speedup: float  # S over the mix
    by_load: dict[str, float]  # s_b per bucket with evidence on both sides
    weights: dict[str, float]  # w_b: share of the time without speculation

    def to_dict(self) -> dict[str, object]:
        return {"speedup": round(self.speedup, 3),
                "by_load": {b: round(s, 3) for b, s in self.by_load.items()},
                "weights": {b: round(w, 3) for b, w in self.weights.items()}}


def summary(load: Mapping[str, LoadStats], min_tokens: int) -> dict[str, tuple[int, float]]:
    """The buckets with enough evidence: tokens and server throughput."""
    need = max(1, int(min_tokens * BUCKET_EVIDENCE))
    return {b: (s.window.tokens, s.throughput) for b, s in load.items()
            if s.throughput and s.window.tokens >= need}


def judge(current: Summary, baseline: Mapping[str, float]) -> MixJudgement | None:
    """The current setting over the mix, or None when the baseline covers too little of it.
    `current` should hold every bucket with evidence (`summary`), `baseline` the
    throughput without speculation per bucket."""
    both = [b for b in current if baseline.get(b)]
    total = sum(n for n, _ in current.values())
    covered = sum(current[b][0] for b in both)
    if not both or total <= 0 or covered < COVERAGE * total:
        return None
    speedups = {b: current[b][1] / baseline[b] for b in both}
    weights = time_weights({b: current[b][0] for b in both}, baseline)
    return MixJudgement(over_mix(speedups, weights, 1.0), speedups, weights)


def time_weights(tokens: Mapping[str, int], baseline: Mapping[str, float]) -> dict[str, float]:
    """w_b: the share of time each bucket's tokens take without speculation."""
    times = {b: n / baseline[b] for b, n in tokens.items() if n > 0 and baseline.get(b)}
    total = sum(times.values())
    return {b: t / total for b, t in times.items()} if total > 0 else {}


def over_mix(speedups: Mapping[str, float], weights: Mapping[str, float],
             fallback: float) -> float:
    """S = 1 / sum(w_b / s_b); a bucket without its own speedup takes `fallback`."""
    if not weights:
        return fallback
    time = sum(w / max(speedups.get(b, fallback), 1e-9) for b, w in weights.items())
    return 1.0 / time if time > 0 else fallback


def lengths_by_load(measured: Mapping[int, Measurement], off_margin: float) -> dict[str, int]:
    """Per bucket, the measured length with the best speedup there, 0 (speculation off at
    that load) when none beats off by `off_margin`; buckets no length was measured at are
    left out. Ties go to the shorter length, as in `speedup.choose`."""
    table: dict[str, int] = {}
    for bucket in LABELS:
        seen = {k: m.by_load[bucket] for k, m in measured.items() if bucket in m.by_load}
        if seen:
            best = max(seen, key=lambda k: (round(seen[k], 6), -k))
            table[bucket] = best if seen[best] >= 1.0 + off_margin else 0
    return table


def table_speedup(measured: Mapping[int, Measurement], table: Mapping[str, int],
                  weights: Mapping[str, float], fallback: float) -> float:
    """The predicted speedup over the mix of running `table` (a bucket at 0 runs at 1.0x)."""
    speedups = {b: measured[k].by_load[b] if k else 1.0 for b, k in table.items()}
    return over_mix(speedups, weights, fallback)


def batch_ranges(table: Mapping[str, int]) -> list[tuple[int, int | None, int]]:
    """The table as (lowest, highest or None, length) ranges of requests running. The first
    range starts at 1 (a load below every measured one takes the lowest measured bucket's
    length: vLLM wants every batch size covered); a gap takes the length below it."""
    ranges = [(low, high, table[label]) for low, high, label in BUCKETS if label in table]
    if ranges:
        ranges[0] = (1, *ranges[0][1:])
    return ranges
