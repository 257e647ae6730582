"""Target states and the transitions allowed between them."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable


class State(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"  # preflight and exec
    LOADING = "loading"  # process runs, not yet serving (health 503 or not listening)
    READY = "ready"
    DEGRADED = "degraded"  # running, but health checks are failing
    BACKOFF = "backoff"  # crashed; waiting before the next start
    WAITING = "waiting"  # the host lacks what it needs (a file, a binary, its port): looks again
    FAILED = "failed"  # gave up; needs a change or a manual restart
    STOPPING = "stopping"
    DETACHED = "detached"  # left running when the daemon exited (systemd units); adopted later
    UNLOADED = "unloaded"  # not running on purpose: loads on its next request (on demand)


# States in which the runtime takes requests (degraded: its probes fail, it still answers).
SERVING = frozenset({State.READY, State.DEGRADED})


def is_live(state: object) -> bool:
    """The one rule of every view: only a serving target's status describes the process that
    runs now. In any other state its rates and resources may still be the previous
    process's (a target one second into loading with a new pid, a failed target without a
    process), so they are not shown: decided by the state alone, not by guessing freshness."""
    return state in SERVING

ALLOWED: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING, State.UNLOADED}),
    # Start-up failures are final, or what the host lacks is waited for (waiting). Stopped
    # or unloaded before any process: a command during a ModelKit's pull.
    State.STARTING: frozenset({State.LOADING, State.FAILED, State.STOPPED, State.UNLOADED,
                               State.WAITING}),
    State.LOADING: frozenset({State.READY, State.BACKOFF, State.FAILED, State.STOPPING,
                              State.DETACHED, State.WAITING}),  # waiting: its port was taken
    State.READY: frozenset({State.DEGRADED, State.BACKOFF, State.FAILED, State.STOPPING,
                            State.DETACHED}),
    State.DEGRADED: frozenset({State.READY, State.BACKOFF, State.FAILED, State.STOPPING,
                               State.DETACHED}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED, State.FAILED,  # internal error
                              State.UNLOADED}),
    # A restart; or a reload that changed a target which loads on demand: unloaded.
    State.FAILED: frozenset({State.STARTING, State.UNLOADED}),
    # Looked again and found (starting), or a command: stop, unload; or an internal error.
    State.WAITING: frozenset({State.STARTING, State.STOPPED, State.UNLOADED, State.FAILED}),
    State.STOPPING: frozenset({State.STOPPED, State.STARTING, State.FAILED,  # internal error
                               State.UNLOADED}),
    State.DETACHED: frozenset(),
    State.UNLOADED: frozenset({State.STARTING}),
}


class StateChanges:
    """What waiters of a target's state changes wait on (the proxy's requests, the fleet's
    loader): woken at every change of the owner's state."""

    def __init__(self) -> None:
        self._changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(self) -> None:
        self._changed.set_result(None)
        self._changed = asyncio.get_running_loop().create_future()

    async def next(self, timeout: float | None = None) -> None:
        """The next change (TimeoutError after `timeout` seconds)."""
        await asyncio.wait_for(asyncio.shield(self._changed), timeout)

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait until `done()` holds, looked at after each change."""
        while not done():
            await asyncio.shield(self._changed)
