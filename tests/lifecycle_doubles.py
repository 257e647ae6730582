"""Stand-ins for the in-process lifecycle tests: a backend registered like a real plugin,
a launcher and the processes it "starts", all driven by a `World` the test controls.

`start_target` (a fixture: this module is a pytest plugin of tests/conftest.py) starts one
owner on them. Real-process tests stay (test_live_daemon.py, test_process_launcher.py); these make each
edge of the state machine cheap to reach and exact to assert.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest

from supervisor.config.schema import Target
from supervisor.events import Event, EventBus
from supervisor.gpu.vram import Estimate
from supervisor.plugin import (
    MISSING,
    Backend,
    Failure,
    FailureKind,
    Launcher,
    LauncherTraits,
    LaunchSpec,
    MetricsSample,
    Probe,
    Problem,
    Readiness,
    RunningProcess,
    RuntimeInfo,
    hookimpl,
)
from supervisor.plugin.registry import build_registry
from supervisor.supervision.commands import Command
from supervisor.supervision.owner import TargetSupervisor
from supervisor.supervision.states import State

# Above any pid the kernel hands out (PID_MAX_LIMIT is 2**22): no real process has one.
_pids = itertools.count(2**22 + 1)


@dataclass
class World:
    """What the fake runtime does; tests change it while the target runs."""

    readiness: Readiness = Readiness.READY
    probe_hangs: bool = False  # the probe never answers (a hung server)
    ignores_sigterm: bool = False
    exit_at_start: int | None = None  # the process exits at once with this status
    output: str = ""  # what the runtime "wrote"
    load_error: bool = False  # explain_failure calls it a model that cannot load
    port_in_use: bool = False  # explain_failure calls it a port another program holds
    starts: list[LaunchSpec] = field(default_factory=list)
    processes: list[FakeProcess] = field(default_factory=list)
    adoptable: FakeProcess | None = None
    probes: int = 0
    metrics: MetricsSample | None = None  # what read_metrics answers
    start_readiness: Readiness | None = None  # what probes answer from the next start on
    memory: int | None = 1024  # bytes the runtime's memory estimate says (None: no estimate)


class FakeProcess(RunningProcess):
    def __init__(self, world: World) -> None:
        self.world = world
        self.pid = next(_pids)
        self.returncode: int | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.signals: list[str] = []

    def exit(self, code: int) -> None:
        """The runtime ends by itself (a crash is a negative code: killed by that signal)."""
        if self.returncode is None:
            self.returncode = code
            self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def stop(self, grace: float) -> int:
        self.signals.append("SIGTERM")
        if not self.world.ignores_sigterm:
            self.exit(-15)
        else:
            try:
                await asyncio.wait_for(self.wait(), grace)
            except TimeoutError:
                self.kill()
        return await self.wait()

    def kill(self) -> None:
        self.signals.append("SIGKILL")
        self.exit(-9)

    def output_tail(self, lines: int = 20) -> str:
        return self.world.output

    def oom_killed(self) -> bool:
        return False


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self, world: World, detaches: bool = False, beside: bool = False) -> None:
        self.world = world
        self.traits = LauncherTraits(detaches=detaches, beside=beside)  # type: ignore[misc]

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> FakeProcess:
        self.world.starts.append(spec)
        if self.world.start_readiness is not None:
            self.world.readiness, self.world.start_readiness = self.world.start_readiness, None
        proc = FakeProcess(self.world)
        self.world.processes.append(proc)
        if self.world.exit_at_start is not None:
            proc.exit(self.world.exit_at_start)
        return proc

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[FakeProcess | None, str]:
        proc, self.world.adoptable = self.world.adoptable, None
        return proc, f"adopted pid {proc.pid}" if proc else ""

    def log_path(self, name: str) -> str:
        return f"(fake log of {name})"


class FakeBackend(Backend):
    name = "fake"
    description = "fake-runtime"
    world: ClassVar[World] = World()  # each instance gets its own from the test fixture

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        # A model given as a path must be there, as the built-in backends check it.
        if target.model.startswith("/") and not Path(target.model).exists():
            return [Problem(("model",), f"model file {target.model!r} does not exist", MISSING)]
        return []

    async def preflight(self) -> RuntimeInfo:
        return RuntimeInfo("/usr/bin/fake-runtime", "1")

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Any = None) -> LaunchSpec:
        return LaunchSpec(("fake-runtime", "--port", str(self.target.port)))

    def with_target(self, target: Target) -> Backend:
        moved = super().with_target(target)
        moved.world = self.world  # type: ignore[attr-defined]
        return moved

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        return Estimate(weights=self.world.memory) if self.world.memory is not None else None

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        self.world.probes += 1
        if self.world.probe_hangs:
            await asyncio.sleep(3600)
        if not self.world.processes or self.world.processes[-1].returncode is not None:
            raise aiohttp.ClientConnectionError("connection refused")  # nothing listens
        return Probe(self.world.readiness, "fake probe")

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        return self.world.metrics

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        if self.world.port_in_use:
            return Failure(FailureKind.PORT_IN_USE, f"couldn't bind to port {self.target.port}")
        if self.world.load_error:
            return Failure(FailureKind.LOAD_ERROR, "fake-runtime could not load the model",
                           retryable=False)
        return None


class FakePlugin:
    """Registered through the registry's plugin manager, as a third-party backend is."""

    @hookimpl
    def register_backends(self, register: Callable[[type], None]) -> None:
        register(FakeBackend)


class FakeClock:
    """A monotonic clock the test moves; crash windows and start timeouts read it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- the in-process harness: one target, its world, its transitions ---

FAST_HEALTH = {"interval": 0.01, "timeout": 0.05, "failures": 3, "metrics_interval": 60,
               "start_timeout": 30}
FAST_RESTART = {"backoff_initial": 0.01, "backoff_max": 0.05, "jitter": 0, "stop_grace": 0.2}

S = State
START = [(S.STOPPED, S.STARTING), (S.STARTING, S.LOADING), (S.LOADING, S.READY)]
RESTART_TO_READY = [(S.STARTING, S.LOADING), (S.LOADING, S.READY)]


class Run:
    """One target under test: its supervisor, its world and the transitions it made."""

    def __init__(self, sup: TargetSupervisor, world: World, events: list[Event]) -> None:
        self.sup, self.world, self.events = sup, world, events
        self._changed = asyncio.Event()

    @property
    def transitions(self) -> list[tuple[State, State]]:
        return [(State(e.old), State(e.new)) for e in self.events if e.kind == "state"]

    def notify(self) -> None:
        self._changed.set()

    async def until(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `done()`, woken by each event (and every 10 ms for conditions that emit
        none, such as a request entering); a scenario that stalls fails instead of hanging."""
        async with asyncio.timeout(timeout):
            while not done():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.01)

    async def reaches(self, state: State, times: int = 1) -> None:
        await self.until(lambda: sum(1 for _, new in self.transitions if new == state) >= times)

    @property
    def process(self) -> Any:
        return self.world.processes[-1]


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
