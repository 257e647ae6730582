"""What the proxy and the API use of a target: api/fleetview.py's ServedTarget protocol.

A collaborator of the owner (owner.py), kept apart so that the owner loop reads on its
own: it only reads the owner's state, and acts through the owner's command queue and its
on-demand book.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from supervisor.supervision.commands import Command
from supervisor.supervision.states import State, is_live

if TYPE_CHECKING:
    from supervisor.supervision.runs import TargetRuns


class Served:
    def __init__(self, owner: TargetRuns) -> None:
        self._owner = owner

    @property
    def name(self) -> str:
        return self._owner.target.name

    @property
    def since(self) -> float:
        return self._owner.since

    @property
    def serving(self) -> bool:
        return is_live(self._owner.state)

    @property
    def base_url(self) -> str:
        return self._owner.backend.base_url  # the node's address under a launcher that places it

    def state_name(self) -> str:
        return self._owner.state.value

    def upstream_model(self) -> str | None:
        return self._owner.backend.openai_model()

    def auth_headers(self) -> dict[str, str]:
        return self._owner.backend.auth_headers()

    @contextlib.asynccontextmanager
    async def relaying(self) -> AsyncIterator[str]:
        """Around one proxied request; gives the address to send it to. The address and the
        request's route are read together, with no await between them, so a switch to a
        server started beside the old one (handover.py) cannot fall in between: a request
        counted on the old route went to the old server. Waits first while the owner holds
        new requests for the old server to drain (requests.hold_new)."""
        await self._owner.requests.admitted()
        base_url = self.base_url
        async with self._owner.requests.relaying():
            yield base_url

    async def arriving(self, klass: str, timeout: float) -> None:
        """Before a request of class `klass` is relayed: where the tuner would rather serve
        it at another setting (off for a class known to lose at every setting after a mix
        without it; the shortest length for a class never seen: AutoTuner.arriving), the
        retune starts now and the request waits, at most `timeout` seconds, until the
        server it goes to runs that setting (the route moved to a server started beside)
        or the target stopped serving (a restart in place: the proxy then waits for it as
        for any restart). Served at the old setting instead, one prose answer at n=16 took
        as long as eight with speculation off (the pair)."""
        owner = self._owner
        if not self.serving or (reason := owner.tuner.arriving(
                klass, owner.requests.in_flight + 1)) is None:
            return
        route = owner.requests.route
        owner.send(Command.RETUNE, reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(owner.changes.until(
                lambda: owner.requests.route != route or not self.serving), max(0.0, timeout))

    def observe_final(self, final: dict[str, Any], klass: str) -> None:
        self._owner.requests.observe(final, klass)

    def restart(self, reason: str) -> None:
        if self._owner.state is State.UNLOADED:
            self._owner.loading.demand(reason)  # a load, with room made as for a request
        else:
            self._owner.send(Command.RESTART, reason)

    def unavailable_reason(self) -> str | None:
        """Why the target will not serve until someone acts, or until what the host lacks
        is there (waiting: a request is not held for a mount that may come back in a day).
        None: it serves, or is on its way: starting, loading, backing off, restarting,
        unloaded and loading on demand."""
        owner = self._owner
        if owner.state is State.UNLOADED:
            refused = owner.loading.load_refused
            return f"unloaded: {refused}" if refused else None
        if self.serving or (owner.wanted and owner.state is not State.WAITING):
            return None
        why = owner.state_event.reason if owner.state_event else ""
        return f"{owner.state.value}" + (f": {why}" if why else "")

    async def wait_serving(self, timeout: float) -> bool:
        """Wait until the target serves, at most `timeout` seconds; False at once when it
        will not come back by itself."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        loading = self._owner.loading
        loading.demand("a request through the proxy")  # unloaded: load it (on demand)
        while not self.serving:
            if loading.load_refused is None:  # unloaded meanwhile (idle, evicted): load again
                loading.demand("a request through the proxy")
            remaining = deadline - loop.time()
            if remaining <= 0 or self.unavailable_reason() is not None:
                return False
            try:
                await self._owner.changes.next(remaining)
            except TimeoutError:
                return False
        return True
