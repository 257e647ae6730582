"""A target's side of on-demand loading (docs/on-demand.md): asking the fleet for a load,
and the book of loads, unloads and cold-start waits shown in its status.

A collaborator of the owner (owner.py) with its own state; it reads the owner's state
through the callables it is given. The decisions (which target to unload for which,
when) are the fleet's (daemon/ondemand.py); a target only asks, and counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from supervisor.config.schema import Target
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.states import State, StateChanges

Emit = Callable[..., None]  # (kind, reason, **data): an event of the target


class OnDemandBook:
    def __init__(self, target: Callable[[], Target], state: Callable[[], State], emit: Emit,
                 changes: StateChanges, requests: ProxyRequests,
                 started_at: Callable[[], float | None]) -> None:
        self._target = target  # the owner's, as its definition is now
        self._state = state
        self._emit = emit
        self._changes = changes
        self._requests = requests
        self._started_at = started_at
        # The fleet's loader (load_with): called with (target, reason) to load it.
        self.on_demand: Callable[[str, str], None] | None = None
        self.loads = 0  # starts on demand, apart from restarts
        self.unloads: dict[str, int] = {}  # by reason: idle, evicted (for memory or a group)
        self.load_refused: str | None = None  # why no load can make room (the fleet says)
        self.cold_start: float | None = None  # seconds from the demand to ready, last load
        self._demanded_at: float | None = None

    def load_with(self, loader: Callable[[str, str], None]) -> None:
        """Who loads the target when a request wants it (the fleet's on-demand loader)."""
        self.on_demand = loader

    def demand(self, reason: str) -> None:
        """A request wants this target: load it if it is unloaded (the fleet decides when)."""
        if self._state() is not State.UNLOADED or self.on_demand is None:
            return
        if self._demanded_at is None:
            self._demanded_at = time.monotonic()
        self.load_refused = None  # decided afresh: the memory may have been freed since
        self.on_demand(self._target().name, reason)

    @property
    def demanded(self) -> bool:
        """A request asked for this target and waits for its load."""
        return self._demanded_at is not None

    def started(self, on_demand: bool) -> None:
        """The owner starts the target: a load (not a restart) is counted."""
        self.load_refused = None
        if on_demand:
            self.loads += 1

    def state_changed(self, new: State) -> None:
        """Book-keeping at each state change of the owner."""
        if new is State.READY and self._demanded_at is not None:
            waited = time.monotonic() - self._demanded_at
            self._demanded_at = None
            self.cold_start = waited
            self._emit("load", f"loaded on demand: the first request waited {waited:.2f} s",
                       waited_s=round(waited, 3))
        elif new in (State.FAILED, State.STOPPED, State.UNLOADED):
            self._demanded_at = None

    def refuse_load(self, why: str) -> None:
        """No unload can make room: requests waiting for it are answered now, with `why`."""
        self.load_refused = why
        self._demanded_at = None
        self._emit("load", why, level="error")
        self._changes.wake()

    def note_wait(self, seconds: float, why: str) -> None:
        self._emit("load", f"waits {seconds:.1f} s before another target may be unloaded "
                   f"for it (min_residency; {why})", wait_s=round(seconds, 3))

    def counted_unload(self, why: str) -> None:
        self.unloads[why] = self.unloads.get(why, 0) + 1

    def last_used(self) -> float:
        """Wall-clock time of the last request through the proxy, or of the last start if
        later (a target just loaded for a request is not idle before the request enters)."""
        return max(self._requests.last_used or 0.0, self._started_at() or 0.0)

    def view(self) -> dict[str, Any]:
        t = self._target()
        return {"start": t.start, "idle_unload": t.idle_unload, "evictable": t.evictable,
                "group": t.group, "loads": self.loads, "unloads": dict(self.unloads),
                "last_used": self._requests.last_used,
                "cold_start_s": round(self.cold_start, 3) if self.cold_start is not None
                else None,
                "load_refused": self.load_refused}
