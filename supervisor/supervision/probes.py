"""The loops that watch a running target: readiness/liveness probes and metrics polling.

Each poll runs under `asyncio.timeout`; a refused connection while the runtime loads is
normal, anything else counts toward `health.failures` consecutive failures, after which
a process that is still alive is treated as hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import psutil

from supervisor.config.schema import Health
from supervisor.plugin.backend import Failure, FailureKind, MetricsSample, Probe, Readiness
from supervisor.supervision.states import State

BUSY_CPU_SHARE = 0.05  # of one core, over a failure streak: "making progress"
# A wake-up this close to a tick belongs to it (a timer may fire a hair early).
TICK_SLACK = 0.001
LOADING_POLL = 0.05  # seconds between probes of a loading runtime


def to_next_tick(now: float, interval: float) -> float:
    """Seconds from `now` to the next multiple of `interval` on the same clock, at least
    `TICK_SLACK` away. Every target polled at the same interval is then polled at the same
    instants, in one wake-up of the daemon: 8 reads of /metrics spread over each second
    cost 1.2 ms of CPU each, read together 0.46 ms (one wake-up, caches still warm)."""
    return interval - (now + TICK_SLACK) % interval + TICK_SLACK


async def sleep_to_next_tick(interval: float) -> None:
    await asyncio.sleep(to_next_tick(asyncio.get_running_loop().time(), interval))


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of a process and its children; None if it cannot be read."""
    if pid <= 0:
        return None
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


@dataclass
class LivenessTracker:
    """A hang is `failures` failed health checks in a row while the process makes no
    progress. A server busy generating for many clients may answer its health check late
    (llama-server's HTTP threads all taken): its CPU time advances, and it is not killed
    for it. A stopped (SIGSTOP) or deadlocked server uses no CPU and is. Where the CPU
    time cannot be read (a server on another host), the failures alone decide."""

    settings: Health
    cpu_seconds: Callable[[], float | None] = lambda: None
    clock: Callable[[], float] = time.monotonic
    consecutive: int = 0
    streak_start: tuple[float, float | None] | None = None  # (clock, CPU) at its 1st failure

    def ok(self) -> None:
        self.consecutive, self.streak_start = 0, None

    def failed(self) -> bool:
        """Record a failed check; True when the process should be declared hung."""
        self.consecutive += 1
        if self.streak_start is None:
            self.streak_start = (self.clock(), self.cpu_seconds())
        if self.consecutive < self.settings.failures:
            return False
        if self._progressed():
            self.ok()  # busy, not hung: a new streak starts with the next failure
            return False
        return True

    def _progressed(self) -> bool:
        assert self.streak_start is not None
        started, cpu_then = self.streak_start
        cpu_now = self.cpu_seconds()
        if cpu_then is None or cpu_now is None:
            return False
        return cpu_now - cpu_then >= max(0.01, BUSY_CPU_SHARE * (self.clock() - started))


class HealthWatch:
    """Probe until the process looks hung or never finishes loading; return why."""

    def __init__(self, health: Health, probe: Callable[[], Awaitable[Probe]],
                 state: Callable[[], State], set_state: Callable[[State, str], None],
                 clock: Callable[[], float],
                 cpu_seconds: Callable[[], float | None] = lambda: None) -> None:
        self.health = health
        self.cpu_seconds = cpu_seconds
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
        liveness = LivenessTracker(self.health, self.cpu_seconds, self.clock)
        deadline = self.clock() + self.health.start_timeout
        while True:
            probe, problem = await self._problem()
            if probe is not None and probe.readiness == Readiness.DEAD:
                return Failure(FailureKind.CRASH, probe.detail)
            if probe is not None and probe.readiness == Readiness.READY:
                liveness.ok()
                if self.state() == State.LOADING:
                    self.set_state(State.READY, f"health check passed after {loaded_after():.1f}s")
                elif self.state() == State.DEGRADED:
                    self.set_state(State.READY, "health check passed")
            if problem is not None:
                if liveness.failed():
                    return Failure(FailureKind.HANG, f"{problem}; {liveness.consecutive} failed "
                                   "health checks in a row while the process is alive and "
                                   "uses no CPU: treating it as hung")
                if self.state() == State.READY:
                    self.set_state(State.DEGRADED, problem)
            if self.state() == State.LOADING and self.clock() > deadline:
                return Failure(FailureKind.START_TIMEOUT, "not ready within start_timeout "
                               f"({self.health.start_timeout:g}s)")
            # Poll quickly while loading so that ready is seen promptly: a request may be
            # waiting for it (a cold start on demand; at 0.5 s, 0.25 s was added on average).
            await sleep_to_next_tick(min(self.health.interval, LOADING_POLL)
                                     if self.state() == State.LOADING else self.health.interval)


class QuietRuntime:
    """Whether a metrics read may be skipped because nothing can have changed: the runtime
    used no CPU time since the previous read (its counters only move while it works), no
    request went to it through the proxy, and that read is less than `max_gap` old.

    A read is a TCP connection to the runtime, most of the daemon's idle CPU with many
    targets (8 targets read every second: about 0.7 % of a core here); the runtime's CPU
    time is one read of /proc. Where it cannot be read (a process on another machine) every
    read is made. CPU time is counted in clock ticks, so a request shorter than a tick may
    go unseen: its counters then arrive with the next read, `max_gap` at the latest."""

    def __init__(self, pid: int, proxy_mark: Callable[[], object],
                 on_quiet: Callable[[float], None], clock: Callable[[], float] = time.monotonic,
                 max_gap: float = 30.0) -> None:
        self._process: psutil.Process | None = None
        with contextlib.suppress(psutil.Error, ValueError):
            self._process = psutil.Process(pid) if pid > 0 else None
        self.proxy_mark = proxy_mark
        self.on_quiet = on_quiet
        self.clock = clock
        self.max_gap = max_gap
        self._last: tuple[float, object, float] | None = None  # (cpu, proxy mark, clock)

    def _cpu(self) -> float | None:
        if self._process is None:
            return None
        try:
            times = self._process.cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system

    def unchanged(self) -> bool:
        """True (and the tuner told that the interval passed idle) when the read can wait."""
        if self._last is None:
            return False
        cpu, mark, at = self._last
        if self.clock() - at >= self.max_gap or self.proxy_mark() != mark or self._cpu() != cpu:
            return False
        self.on_quiet(time.time())
        return True

    def read(self) -> None:
        """After a read: what the next check compares with (our own request's CPU included)."""
        cpu = self._cpu()
        self._last = None if cpu is None else (cpu, self.proxy_mark(), self.clock())


async def until_ready(probe: Callable[[], Awaitable[Probe]], health: Health,
                      exited: Callable[[], int | None], poll: float = 0.1) -> str | None:
    """Probe a server that is not supervised yet (started beside a serving one, or by
    `specfleet bench`) until it is ready: None then, else why not (it exited, says it will
    not serve, or is still loading after `health.start_timeout`)."""
    deadline = time.monotonic() + health.start_timeout
    while time.monotonic() < deadline:
        if (code := exited()) is not None:
            return f"exited with status {code} while it loaded"
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with asyncio.timeout(health.timeout):
                answer = await probe()
            if answer.readiness is Readiness.READY:
                return None
            if answer.readiness is Readiness.DEAD:
                return f"will not serve ({answer.detail})"
        await asyncio.sleep(poll)
    return f"was not ready within health.start_timeout ({health.start_timeout:g}s)"


async def poll_metrics(health: Health, read: Callable[[], Awaitable[MetricsSample | None]],
                       serving: Callable[[], bool],
                       on_sample: Callable[[MetricsSample], None],
                       quiet: QuietRuntime | None = None) -> None:
    """Read the runtime's counters every `metrics_interval` while it serves (unless `quiet`
    says nothing can have changed)."""
    while True:
        await sleep_to_next_tick(health.metrics_interval)
        if not serving() or (quiet is not None and quiet.unchanged()):
            continue
        with contextlib.suppress(TimeoutError, aiohttp.ClientError, ValueError):
            async with asyncio.timeout(health.timeout):
                sample = await read()
            if sample is not None:
                on_sample(sample)
                if quiet is not None:
                    quiet.read()
