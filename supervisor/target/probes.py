"""The loops that watch a running target: readiness/liveness probes and metrics polling.

Each poll runs under `asyncio.timeout`; a refused connection while the runtime loads is
normal, anything else counts toward `health.failures` consecutive failures, after which
a process that is still alive is treated as hung.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from supervisor.config.schema import Health
from supervisor.plugin.backend import Failure, FailureKind, MetricsSample, Probe, Readiness
from supervisor.target.states import State


@dataclass
class LivenessTracker:
    """Counts consecutive failed health checks; a hang is `failures` of them in a row."""

    settings: Health
    consecutive: int = 0

    def ok(self) -> None:
        self.consecutive = 0

    def failed(self) -> bool:
        """Record a failed check; True when the process should be declared hung."""
        self.consecutive += 1
        return self.consecutive >= self.settings.failures


class HealthWatch:
    """Probe until the process looks hung or never finishes loading; return why."""

    def __init__(self, health: Health, probe: Callable[[], Awaitable[Probe]],
                 state: Callable[[], State], set_state: Callable[[State, str], None],
                 clock: Callable[[], float]) -> None:
        self.health = health
        self.probe = probe
        self.state = state
        self.set_state = set_state
        self.clock = clock

    async def _problem(self) -> tuple[Probe | None, str | None]:
        """One probe: (its answer, or None) and the problem it shows, if any."""
        try:
            async with asyncio.timeout(self.health.timeout):
                probe = await self.probe()
        except TimeoutError:
            return None, f"no answer to a health check within {self.health.timeout:g}s"
        except aiohttp.ClientError as exc:
            # Before the runtime binds its port, refusal is normal.
            return None, None if self.state() == State.LOADING else f"health check failed: {exc}"
        if probe.readiness == Readiness.READY:
            return probe, None
        if probe.readiness == Readiness.UNHEALTHY or self.state() != State.LOADING:
            return probe, f"unhealthy: {probe.detail}"
        return probe, None

    async def run(self, loaded_after: Callable[[], float]) -> Failure:
        """`loaded_after()` gives the seconds since the start, for the ready message."""
        liveness = LivenessTracker(self.health)
        deadline = self.clock() + self.health.start_timeout
        while True:
            probe, problem = await self._problem()
            if probe is not None and probe.readiness == Readiness.READY:
                liveness.ok()
                if self.state() == State.LOADING:
                    self.set_state(State.READY, f"health check passed after {loaded_after():.1f}s")
                elif self.state() == State.DEGRADED:
                    self.set_state(State.READY, "health check passed")
            if problem is not None:
                if liveness.failed():
                    return Failure(FailureKind.HANG, f"{problem}; {liveness.consecutive} failed "
                                   "health checks in a row while the process is alive: "
                                   "treating it as hung")
                if self.state() == State.READY:
                    self.set_state(State.DEGRADED, problem)
            if self.state() == State.LOADING and self.clock() > deadline:
                return Failure(FailureKind.START_TIMEOUT, "not ready within start_timeout "
                               f"({self.health.start_timeout:g}s)")
            # Poll quickly while loading so that ready is seen promptly.
            await asyncio.sleep(min(self.health.interval, 0.5) if self.state() == State.LOADING
                                else self.health.interval)


async def poll_metrics(health: Health, read: Callable[[], Awaitable[MetricsSample | None]],
                       serving: Callable[[], bool],
                       on_sample: Callable[[MetricsSample], None]) -> None:
    """Read the runtime's counters every `metrics_interval` while it serves."""
    while True:
        await asyncio.sleep(health.metrics_interval)
        if not serving():
            continue
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, ValueError):
            async with asyncio.timeout(health.timeout):
                sample = await read()
            if sample is not None:
                on_sample(sample)
