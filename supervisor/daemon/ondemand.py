"""On-demand loading for the fleet (docs/on-demand.md): loads an unloaded target when a
request wants it, unloading others first where the VRAM plan says it does not fit beside
them (gpu/swap.py decides which), and unloads targets idle for their `idle_unload`.

Loads are decided one at a time, in the order they were asked for, so two loads never
count on the same free memory, and requests waiting for a target that waits for a
minimum residency are served in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from supervisor.gpu import swap
from supervisor.gpu.placement import Placer
from supervisor.supervision.commands import Command
from supervisor.supervision.owner import TargetSupervisor
from supervisor.supervision.states import State
from supervisor.supervision.waiting import lacking

_NOT_LOADED = frozenset({State.UNLOADED, State.STOPPED, State.FAILED, State.DETACHED,
                         State.WAITING})
IDLE_CHECK = 1.0  # seconds between two looks for idle targets
WAIT_STEP = 1.0  # a load waiting for a residency decides again at least this often


class OnDemandLoader:
    def __init__(self, supervisors: Callable[[], Mapping[str, TargetSupervisor]],
                 placer: Placer, clock: Callable[[], float] = time.time) -> None:
        self.supervisors = supervisors
        self.placer = placer
        self.clock = clock
        self._lock = asyncio.Lock()  # FIFO: loads are decided in the order asked
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._unloading: set[str] = set()
        self._idle_unloads: set[asyncio.Task[None]] = set()

    def attach(self, sup: TargetSupervisor) -> None:
        sup.loading.load_with(self.demand)

    def demand(self, name: str, reason: str) -> None:
        """Load `name` (called by the target when a request wants it while unloaded)."""
        task = self._loading.get(name)
        if task is None or task.done():
            self._loading[name] = asyncio.create_task(self._load(name, reason),
                                                      name=f"load:{name}")

    async def _load(self, name: str, reason: str) -> None:
        async with self._lock:
            said_wait = False
            while (sup := self.supervisors().get(name)) is not None \
                    and sup.state is State.UNLOADED:
                if (why := await asyncio.to_thread(lacking, sup.backend)):
                    sup.loading.refuse_load(f"cannot load: {why}")  # and evict nothing for it
                    return
                choice = self._choose(sup)
                if choice.impossible is not None:
                    sup.loading.refuse_load(f"cannot load: {choice.impossible}")
                    return
                if choice.wait_until is not None:
                    if not said_wait:
                        said_wait = True
                        sup.loading.note_wait(choice.wait_until - self.clock(), choice.why)
                    await asyncio.sleep(min(WAIT_STEP, max(0.05, choice.wait_until
                                                           - self.clock())))
                    continue
                why = f"to load {name} ({choice.why})" if choice.why else f"to load {name}"
                await asyncio.gather(*(self.unload(v, f"evicted {why}", "evicted")
                                       for v in choice.evict))
                sup.send(Command.START, reason)
                # Loading from here on: the next decision counts it.
                await sup.changes.until(lambda s=sup: s.state is not State.UNLOADED)
                return

    def _choose(self, sup: TargetSupervisor) -> swap.Choice:
        plan = self.placer.fleet_plan.plan if self.placer.fleet_plan else None
        room = plan.room if plan is not None else None

        def share(name: str) -> dict[int, int]:
            assignment = self.placer.assignment(name)
            return dict(assignment.per_gpu) if room is not None and assignment else {}

        def started(o: TargetSupervisor) -> float:
            # Still starting: its process (and its residency) has not begun; started_at
            # is the last run's.
            return self.clock() if o.state is State.STARTING or o.started_at is None \
                else o.started_at

        loaded = [swap.Loaded(o.name, share(o.name), o.target.evictable,
                              started(o), o.loading.last_used(),
                              o.requests.in_flight, o.target.min_residency, o.target.group)
                  for o in self.supervisors().values()
                  if o is not sup and o.target.swaps and o.state not in _NOT_LOADED
                  and o.name not in self._unloading]
        return swap.choose(share(sup.name), room or {}, loaded, self.clock(), sup.target.group)

    async def unload(self, name: str, reason: str, kind: str) -> None:
        """Drain, stop and mark `name` unloaded; returns when it is."""
        sup = self.supervisors().get(name)
        if sup is None or name in self._unloading:
            return
        self._unloading.add(name)
        try:
            sup.loading.counted_unload(kind)
            sup.send(Command.UNLOAD, reason)
            await sup.changes.until(lambda: sup.state in _NOT_LOADED)
        finally:
            self._unloading.discard(name)

    async def run(self) -> None:
        """Unload targets idle for their `idle_unload` (no request through the proxy, none
        running in the runtime as its counters last said)."""
        while True:
            await asyncio.sleep(IDLE_CHECK)
            now = self.clock()
            for sup in list(self.supervisors().values()):
                limit = sup.target.idle_unload
                if limit is None or not sup.serving or sup.requests.in_flight \
                        or (sup.metrics is not None and sup.metrics.requests_processing) \
                        or sup.name in self._unloading or now - sup.loading.last_used() < limit:
                    continue
                task = asyncio.create_task(self.unload(
                    sup.name, f"idle for {now - sup.loading.last_used():.0f} s (idle_unload "
                    f"{limit:g} s)", "idle"), name=f"unload:{sup.name}")
                self._idle_unloads.add(task)
                task.add_done_callback(self._idle_unloads.discard)

    def close(self) -> None:
        for task in [*self._loading.values(), *self._idle_unloads]:
            task.cancel()
