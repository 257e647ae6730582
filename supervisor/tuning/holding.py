"""What a restart costs a tuning decision: how long it waits before it is applied, and
whether it pays back at all.

A restart beside the running server (supervision/handover.py) costs no service: it is
applied at once, busy or not. A restart in place costs its load time with nothing served,
so it waits for an idle server, but not for ever: while it waits the server runs the old
setting and gives up the predicted gain on every second of it, and once that loss exceeds
what the restart costs (`restart_seconds / gain` seconds, the restart's own measured load
time over the predicted gain) waiting longer loses more than restarting now. A decision
with no predicted gain (measuring the baseline, trying a length to fit the cost model) is
valued at `tuning.min_gain`, the least gain worth a restart. `tuning.max_wait` stays the
upper bound, and is the bound before any load time was measured.

`payback` is asked before the waiting starts: a new length predicted `gain` faster pays for
its switch only if the workload lasts long enough (docs/tuning.md, "A restart must pay
back").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.tuning.decisions import Action, Decision
from supervisor.tuning.store import TunerMemory


@dataclass(frozen=True)
class Hold:
    seconds: float  # the longest wait for an idle server
    why: str  # what status shows the tuner waiting for


def hold(max_wait: float, restart_seconds: float | None, gain: float | None, min_gain: float,
         free: bool) -> Hold:
    if free:
        return Hold(0.0, "nothing: the new server starts beside the running one")
    value = gain if gain is not None and gain > 0 else min_gain
    if restart_seconds is None or value <= 0:  # no start timed yet; min_gain 0: no value
        return Hold(max_wait, f"an idle server, or {max_wait:g}s (tuning.max_wait)")
    limit = min(max_wait, restart_seconds / value)
    return Hold(limit, f"an idle server, or {limit:.0f}s: a restart in place costs about "
                f"{restart_seconds:.1f}s with nothing served, and waiting loses about "
                f"{value:.0%} of the throughput meanwhile")


# On the CPU both servers share the cores while the new one loads: the old one serves at
# about half its speed meanwhile (an estimate; on a GPU the load is mostly a copy).
BESIDE_SHARE = 0.5


@dataclass(frozen=True)
class Payback:
    pays: bool
    seconds: float  # how long the workload must last for the switch to pay for itself
    why: str
    data: dict[str, float]


def payback(gain: float, restart_seconds: float | None, beside: bool, warm_seconds: float,
            lasted: float) -> Payback | None:
    """Whether a switch to a setting predicted `gain` faster pays for what it costs: the
    load of the new server (`restart_seconds` with nothing served in place; a share of it
    beside the old one) and the warm-up of a drafter that learns (`warm_seconds` at no gain).
    How long the workload will last is not known; it is taken to last about as long again
    as it has so far (`lasted`: since the tuner first saw it, or since the last drift).
    None where the cost is not known yet (no start was timed): nothing to weigh."""
    if restart_seconds is None or gain <= 0:
        return None
    outage = restart_seconds * (BESIDE_SHARE if beside else 1.0)
    needed = outage / gain + warm_seconds
    data = {"switch_cost_s": round(outage, 2), "warm_up_s": round(warm_seconds, 1),
            "pays_back_after_s": round(needed, 1), "workload_lasted_s": round(lasted, 1)}
    why = (f"a switch costs about {outage:.1f}s of service"
           + (f" and {warm_seconds:.0f}s of warm-up" if warm_seconds else "")
           + f", paid back after {needed:.0f}s at {gain:+.0%}; this workload has lasted "
           f"{lasted:.0f}s")
    return Payback(lasted >= needed, needed, why, data)


def weigh(decision: Decision | None, memory: TunerMemory, current: int,
          restart_seconds: float | None, beside: bool, warm_seconds: float,
          lasted: float) -> Decision | None:
    """A new length (a retune, an exploration) kept only if its switch pays back; else a
    KEEP that records the measurement and says why. Other decisions pass as they are."""
    if decision is None or decision.action not in (Action.RETUNE, Action.EXPLORE):
        return decision
    verdict = payback(float(decision.data.get("predicted_gain") or 0.0), restart_seconds,
                      beside, warm_seconds, lasted)
    if verdict is None:
        return decision
    data = {**decision.data, **verdict.data}
    if verdict.pays:
        return replace(decision, data=data)
    kept = replace(decision.memory, length=memory.length, last_change=memory.last_change,
                   last_decision=data)
    return Decision(Action.KEEP, kept, f"keeping draft length {current}: "
                    f"{decision.reason.split(':', 1)[0]} would not pay back yet ({verdict.why})",
                    data)
