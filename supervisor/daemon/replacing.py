"""A reload that changes a serving target, without a gap in service.

Stopping the old supervisor and adding a new one would leave the target with nothing
served for as long as the new server loads: the proxy's requests in flight cut, the ones
that arrive meanwhile refused. Instead, under the rules of a retune's restart beside the
running server (supervision/handover.py: `restart.replace`, the launcher's `beside` trait,
the proxy, room in memory for both), the changed target gets a supervisor of its own at
once, whose server starts on a free port while the old supervisor's serves:

1. once the new server is ready, the proxy's new requests go to the new supervisor (the
   proxy looks a target up by name for each request);
2. the old supervisor's server finishes the requests it has (at most the new target's
   `health.start_timeout`), then it stops. Where both servers compute on the same CPU
   cores, the new one's first requests wait for those (at most 30 s) and its tuner takes
   nothing it measures meanwhile as evidence, as in a retune's handover.

A new server that cannot start, exits or is not ready within its `health.start_timeout`
(plus a load's grace) is stopped and the reload falls back to a restart in place (the
old server stops, the new supervisor starts on the configured port, where its failure
shows the runtime's own output); the `replace` event says why. Clients of the runtime's
own port see it move to the free port (the configured one again at its next restart
beside, once free).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from supervisor.config.schema import Target
from supervisor.events import Event, EventBus
from supervisor.supervision.handover import (
    CPU_HOLD,
    held_words,
    holds_new_requests,
    in_place_reason,
    port_beside,
    room_beside,
)
from supervisor.supervision.owner import TargetSupervisor
from supervisor.supervision.states import SERVING, State

# States a new supervisor's first start ends in when it did not become ready (not
# `stopped`: that is also where it is before its task first runs).
NOT_READY = frozenset({State.BACKOFF, State.FAILED, State.WAITING})
# Beyond `health.start_timeout`: the preflight and exec before the load is timed.
GRACE = 30.0


def reload_in_place_reason(old: Target, old_state: State, new: Target, beside_trait: bool,
                           proxied: bool) -> str | None:
    """Why a reload that changes `old` into `new` restarts it in place; None: the new
    server may start beside the old one (memory permitting)."""
    if old_state not in SERVING:
        return f"it is {old_state.value}, so there is no service to keep"
    if old.launcher != new.launcher:
        return f"its launcher changes ({old.launcher} -> {new.launcher})"
    return in_place_reason(new.restart.replace, beside_trait, new.launcher, proxied)


def _emit(events: EventBus, name: str, reason: str, **data: Any) -> None:
    events.emit(Event(name, "replace", reason, data=data))


async def until_serving(sup: TargetSupervisor, timeout: float) -> str | None:
    """None once `sup` serves; else what it did instead."""
    try:
        await asyncio.wait_for(sup.changes.until(
            lambda: sup.state in SERVING or sup.state in NOT_READY), timeout)
    except TimeoutError:
        return f"was not ready within {timeout:g}s"
    if sup.state in SERVING:
        return None
    return f"went {sup.state.value}" + (f": {sup.last_event.reason}" if sup.last_event else "")


async def replace_beside(old: TargetSupervisor, new: TargetSupervisor, events: EventBus,
                         start: Callable[[TargetSupervisor], None],
                         switch: Callable[[TargetSupervisor], None]) -> bool:
    """`start(new)` beside `old`; once it serves, `switch(new)` and retire `old`. False (and
    `new` stopped, `old` untouched) where it could not: the caller restarts in place."""
    name = old.name
    fits, detail = await room_beside(new)
    if not fits:
        _emit(events, name, f"restarting in place after the reload: {detail}",
              replace="in_place")
        return False
    new.backend = port_beside(new.home)
    old_pid = old.process.pid if old.process is not None else None
    _emit(events, name, f"the changed target starts on port {new.backend.target.port} beside "
          f"pid {old_pid}, which serves meanwhile ({detail})", replace="beside",
          port=new.backend.target.port)
    start(new)
    why = await until_serving(new, new.target.health.start_timeout + GRACE)
    if why is not None:
        output = new.failure_output or (new.process.output_tail() if new.process else None)
        await new.shutdown("could not start beside the old server")
        _emit(events, name, f"the changed target's new server {why}; restarting in place",
              replace="in_place", output=output)
        return False
    left = old.requests.in_flight
    held = holds_new_requests(new, left)
    if held:  # before the switch: no request may reach the new server unheld
        new.requests.hold_for(old.requests, CPU_HOLD)
        new.tuner.sharing_cores = True
    switch(new)
    pid = new.process.pid if new.process is not None else None
    _emit(events, name, f"proxy requests go to pid {pid} now; pid {old_pid} finishes its "
          f"{left} request(s) in flight" + held_words(held),
          replace="switched", pid=pid, in_flight=left, held=held)
    try:
        drained = await old.requests.drained(new.target.health.start_timeout)
        await old.shutdown("replaced by its changed definition (reload)")
    finally:
        if held and not new.retiring:  # a handover of its own clears it when it ends
            new.tuner.sharing_cores = False
    _emit(events, name, f"pid {old_pid} stopped: "
          + ("its requests were done" if drained else
             f"requests still in flight after {new.target.health.start_timeout:g}s"),
          replace="retired", pid=old_pid)
    return True
