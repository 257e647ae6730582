"""How long a decision that needs a restart waits before it is applied.

A restart beside the running server (supervision/handover.py) costs no service: it is
applied at once, busy or not. A restart in place costs its load time with nothing served,
so it waits for an idle server, but not for ever: while it waits the server runs the old
setting and gives up the predicted gain on every second of it, and once that loss exceeds
what the restart costs (`restart_seconds / gain` seconds, the restart's own measured load
time over the predicted gain) waiting longer loses more than restarting now. A decision
with no predicted gain (measuring the baseline, trying a length to fit the cost model) is
valued at `tuning.min_gain`, the least gain worth a restart. `tuning.max_wait` stays the
upper bound, and is the bound before any load time was measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    seconds: float  # the longest wait for an idle server
    why: str  # what status shows the tuner waiting for


def hold(max_wait: float, restart_seconds: float | None, gain: float | None, min_gain: float,
         free: bool) -> Hold:
    if free:
        return Hold(0.0, "nothing: the new server starts beside the running one")
    if restart_seconds is None:
        return Hold(max_wait, f"an idle server, or {max_wait:g}s (tuning.max_wait)")
    value = gain if gain is not None and gain > 0 else min_gain
    limit = min(max_wait, restart_seconds / value)
    return Hold(limit, f"an idle server, or {limit:.0f}s: a restart in place costs about "
                f"{restart_seconds:.1f}s with nothing served, and waiting loses about "
                f"{value:.0%} of the throughput meanwhile")
