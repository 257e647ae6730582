"""What the proxy and the API use of a target: api/fleetview.py's ServedTarget protocol,
implemented for TargetSupervisor.

A mixin of TargetSupervisor, kept apart so that the owner loop reads on its own: it only
reads the owner's state, and acts through the owner's command queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from supervisor.config.schema import Target
from supervisor.events import Event
from supervisor.plugin.backend import Backend
from supervisor.plugin.launching import RunningProcess
from supervisor.supervision.commands import Command
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.states import State, is_live


class ServedTargetMixin:
    target: Target
    backend: Backend
    requests: ProxyRequests
    state: State
    placement: dict[str, Any]  # GPUs from the VRAM plan; the node under launcher: ray
    last_event: Event | None
    # Whether the owner means to run the target (False once it gave up, stopped or detached):
    # a request for a target that will not come back by itself is refused at once.
    _wanted: bool
    _changed: asyncio.Future[None]  # resolved (and replaced) at every state change

    def send(self, command: Command, reason: str) -> None:
        raise NotImplementedError

    demand: Callable[[str], None]  # load it if unloaded (supervision/ondemand.py)
    load_refused: str | None

    @property
    def serving(self) -> bool:
        return is_live(self.state)

    @property
    def base_url(self) -> str:
        return self.backend.base_url  # the node's address under a launcher that places it

    def _follow(self, proc: RunningProcess) -> None:
        """Probes, counters, the proxy and the run record follow the process to its node."""
        where = dict(proc.location)
        self.backend.node_address = where.get("address")
        self.placement = {k: v for k, v in self.placement.items()
                          if k not in ("node", "node_id", "address", "node_gpus")}
        self.placement.update(where)

    def state_name(self) -> str:
        return self.state.value

    def upstream_model(self) -> str | None:
        return self.backend.openai_model()

    def auth_headers(self) -> dict[str, str]:
        return self.backend.auth_headers()

    def relaying(self) -> AbstractAsyncContextManager[None]:
        return self.requests.relaying()

    def observe_timings(self, timings: dict[str, Any]) -> None:
        self.requests.observe(timings)

    def restart(self, reason: str) -> None:
        if self.state is State.UNLOADED:
            self.demand(reason)  # a load, with room made by the fleet as for a request
        else:
            self.send(Command.RESTART, reason)

    def unavailable_reason(self) -> str | None:
        """Why the target will not serve until someone acts (None: it serves, or is on its
        way: starting, loading, backing off, restarting, unloaded and loading on demand)."""
        if self.state is State.UNLOADED:
            return f"unloaded: {self.load_refused}" if self.load_refused else None
        if self.serving or self._wanted:
            return None
        why = self.last_event.reason if self.last_event else ""
        return f"{self.state.value}" + (f": {why}" if why else "")

    async def wait_serving(self, timeout: float) -> bool:
        """Wait until the target serves, at most `timeout` seconds; False at once when it
        will not come back by itself."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.demand("a request through the proxy")  # unloaded: load it (on demand)
        while not self.serving:
            if self.load_refused is None:  # unloaded meanwhile (idle, evicted): load again
                self.demand("a request through the proxy")
            remaining = deadline - loop.time()
            if remaining <= 0 or self.unavailable_reason() is not None:
                return False
            try:
                await asyncio.wait_for(asyncio.shield(self._changed), remaining)
            except TimeoutError:
                return False
        return True
