"""Which loaded targets to unload so that another can load (docs/on-demand.md). Pure:
numbers in, a choice out; the fleet's on-demand loader (daemon/ondemand.py) acts on it.

The room on each GPU is what the VRAM plan left after the targets that always run
(`capacity`); every target loaded on demand holds its planned share of it. To load
a target whose share does not fit, the least recently used loaded targets that may be
evicted are unloaded, those without a request in flight first, until it fits. Members
of its group are unloaded whatever the memory. A target is not unloaded for another
within its minimum residency: then the load waits until it may be.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.gpu.vram import gib


@dataclass(frozen=True)
class Loaded:
    """A target that is loaded (or loading) on demand."""

    name: str
    per_gpu: Mapping[int, int]  # its planned share of each GPU it uses
    evictable: bool
    started: float  # wall clock, when its process started
    last_used: float  # wall clock of its last request through the proxy
    in_flight: int
    min_residency: float
    group: str | None = None

    @property
    def evictable_at(self) -> float:
        return self.started + self.min_residency


@dataclass(frozen=True)
class Choice:
    evict: tuple[str, ...] = ()  # unload these (in this order), then load
    wait_until: float | None = None  # nothing may be unloaded yet: decide again then
    impossible: str | None = None  # no unload can make room (pinned targets hold it)
    why: str = ""  # for the events: what is short, or the group


def shortfall(need: Mapping[int, int], capacity: Mapping[int, int],
              loaded: Sequence[Loaded]) -> dict[int, int]:
    """Bytes missing on each GPU for `need` beside `loaded`."""
    short = {}
    for gpu, n in need.items():
        used = sum(t.per_gpu.get(gpu, 0) for t in loaded)
        if (missing := n + used - capacity.get(gpu, 0)) > 0:
            short[gpu] = missing
    return short


def choose(need: Mapping[int, int], capacity: Mapping[int, int], loaded: Sequence[Loaded],
           now: float, group: str | None = None) -> Choice:
    """What to unload so that a target needing `need` bytes per GPU (empty: no GPU plan)
    can load beside `loaded`, at wall-clock time `now`."""
    chosen = [t for t in loaded if group is not None and t.group == group]
    why = f"group {group}" if chosen else ""
    rest = [t for t in loaded if t not in chosen]
    short = shortfall(need, capacity, rest)
    if short:
        why = _describe(short) + (f"; and {why}" if why else "")
        # Those that may go now first; then those in flight last; the least recently used first.
        candidates = sorted((t for t in rest if t.evictable and set(t.per_gpu) & set(short)),
                            key=lambda t: (t.evictable_at > now, t.in_flight > 0, t.last_used))
        for t in candidates:
            if not short:
                break
            if set(t.per_gpu) & set(short):
                chosen.append(t)
                short = shortfall(need, capacity, [u for u in rest if u not in chosen])
        if short:
            pinned = [t.name for t in rest if t not in chosen]
            return Choice(impossible=f"{_describe(short)} even with every evictable target "
                          "unloaded" + (f" (held by {', '.join(pinned)}, not evictable)"
                                        if pinned else ""), why=why)
    waiting = [t.evictable_at for t in chosen if t.evictable_at > now]
    if waiting:
        return Choice(wait_until=max(waiting), why=why)
    return Choice(evict=tuple(t.name for t in chosen), why=why)


def _describe(short: Mapping[int, int]) -> str:
    return ", ".join(f"{gib(n)} short on GPU {g}" for g, n in sorted(short.items()))
