"""The in-process owner under test (tests/lifecycle_doubles.py): `start_target` starts a
target on a fake backend and launcher, in a world the test controls."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from supervisor.config.schema import Target
from supervisor.events import EventBus
from supervisor.plugin.registry import build_registry
from supervisor.supervision.commands import Command
from supervisor.supervision.owner import TargetSupervisor
from tests.lifecycle_doubles import (
    FAST_HEALTH,
    FAST_RESTART,
    FakeBackend,
    FakeClock,
    FakeLauncher,
    FakePlugin,
    FakeProcess,
    Run,
    World,
)


@pytest.fixture
async def start_target() -> AsyncIterator[Callable[..., Run]]:
    registry = build_registry([FakePlugin()], entry_points=False)
    runs: list[Run] = []
    async with aiohttp.ClientSession() as http:

        def start(detaches: bool = False, clock: Callable[[], float] | None = None,
                  adopt: bool = False, unloaded: bool = False, beside: bool = False,
                  proxied: bool = True, kits: Any = None, **over: Any) -> Run:
            world = World()
            if adopt:  # a process left running by the previous daemon
                world.adoptable = FakeProcess(world)
                world.processes.append(world.adoptable)
            settings: dict[str, Any] = {"name": "t", "backend": "fake", "model": "m", "port": 1,
                                        "health": dict(FAST_HEALTH),
                                        "restart": dict(FAST_RESTART)}
            for key, value in over.items():
                settings[key] = {**settings[key], **value} if key in ("health", "restart") \
                    else value
            target = Target(**settings)
            backend = registry.backend_for(target)
            assert isinstance(backend, FakeBackend)
            backend.world = world
            bus, events = EventBus(), []
            sup = TargetSupervisor(target, backend, FakeLauncher(world, detaches, beside), bus,
                                   http, clock=clock or FakeClock(), rand=lambda: 0.5,
                                   unloaded=unloaded, proxied=proxied, kits=kits)
            # The fleet's loader, as simple as it gets: every demand loads at once.
            sup.loading.load_with(lambda name, reason: sup.send(Command.START, reason))
            run = Run(sup, world, events)
            bus.subscribe(lambda e: (events.append(e), run.notify()))
            runs.append(run)
            sup.start_owner_task()
            return run

        yield start
        for run in runs:
            await run.sup.shutdown("test over")
