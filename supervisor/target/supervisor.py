"""TargetSupervisor: one asyncio task owns one target's state.

Everything else sends it commands (start, stop, restart, shutdown) through a
queue; only the owner task changes the state, through `_set_state`, which checks
the transition against ALLOWED, drops no-op transitions and emits an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError, StartRefused
from supervisor.events import Event, EventBus
from supervisor.gpu.placement import Placer
from supervisor.launcher.base import Launcher, RunningProcess
from supervisor.plugin.backend import Backend, Failure, FailureKind, MetricsSample, Readiness
from supervisor.target import restart_policy as policy
from supervisor.target.runrecord import RunRecorder
from supervisor.target.states import ALLOWED, State
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.decisions import TuningStore


@dataclass(frozen=True)
class Command:
    kind: str  # "start" | "stop" | "restart" | "retune" | "shutdown" | "detach"
    reason: str


@dataclass
class TargetStatus:
    """What `specfleet status` and the API show; a plain snapshot, safe to serialise."""

    name: str
    backend: str
    endpoint: str
    model: str
    state: str
    since: float
    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0
    last_event: dict[str, Any] | None = None
    failure_output: str | None = None
    runtime: dict[str, str] = field(default_factory=dict)
    speculation: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    tuning: dict[str, Any] = field(default_factory=dict)
    retunes: int = 0
    log_file: str | None = None
    placement: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)  # VRAM, RSS, CPU (the monitor)
    warnings: list[str] = field(default_factory=list)  # the pairing guard's, at the last start
    requests: dict[str, Any] = field(default_factory=dict)  # seen by the proxy (docs/api.md)


def _exit_description(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with status {code}"


class TargetSupervisor:
    def __init__(self, target: Target, backend: Backend, launcher: Launcher, events: EventBus,
                 http: aiohttp.ClientSession, *, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random, log_file: str | None = None,
                 tuning_store: TuningStore | None = None, placer: Placer | None = None,
                 records: RunRecorder | None = None, launcher_name: str = "process") -> None:
        self.target = target
        self.backend = backend
        self.launcher = launcher
        self.events = events
        self.http = http
        self.clock = clock
        self.rand = rand
        self.state = State.STOPPED
        self.since = time.time()
        self.process: RunningProcess | None = None
        self.started_at: float | None = None
        self.restarts = 0
        self.last_event: Event | None = None
        self.failure_output: str | None = None
        self.runtime: dict[str, str] = {}
        self.metrics: MetricsSample | None = None
        self.log_file = log_file
        self.tuner = AutoTuner(target, backend, tuning_store, self._event, clock)
        self.placer = placer
        self.records = records
        self.launcher_name = launcher_name
        self.placement: dict[str, Any] = {}
        self.resources: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.requests: dict[str, Any] = {"count": 0, "draft_tokens": 0, "accepted_tokens": 0}
        self.serving = asyncio.Event()  # set while ready (or degraded): the proxy waits on it
        self.inflight = 0  # proxy requests being relayed to this target
        self._crash_times: list[float] = []
        self._oom_times: list[float] = []
        self._may_adopt = launcher.detaches  # only the first start may find a running unit
        self._detached = False
        self._commands: asyncio.Queue[Command] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._pending_reason = "daemon started"  # the reason the next start will carry

    @property
    def name(self) -> str:
        return self.target.name

    # --- the API other tasks use ---

    def launch(self) -> asyncio.Task[None]:
        """Start the owner task; the target starts at once."""
        self._task = asyncio.create_task(self.run(), name=f"target:{self.name}")
        return self._task

    def send(self, kind: str, reason: str) -> None:
        self._commands.put_nowait(Command(kind, reason))

    async def shutdown(self, reason: str) -> None:
        """Stop the process and end the owner task."""
        if self._task is None or self._task.done():
            return
        self.send("shutdown", reason)
        await self._task

    async def detach(self, reason: str) -> None:
        """End the owner task and leave the target running (a systemd unit, adopted by the
        next daemon)."""
        if self._task is None or self._task.done():
            return
        self.send("detach", reason)
        await self._task

    def observe_request(self, timings: dict[str, Any]) -> None:
        """Per-request draft counts the runtime returned with a completion (llama.cpp's
        `timings`), from the proxy: the acceptance the clients actually got. Shown beside the
        runtime's counters; the tuner reads the counters."""
        self.requests["count"] += 1
        self.requests["draft_tokens"] += int(timings.get("draft_n", 0) or 0)
        self.requests["accepted_tokens"] += int(timings.get("draft_n_accepted", 0) or 0)

    def _event(self, kind: str, reason: str, **data: Any) -> None:
        self.events.emit(Event(self.name, kind, reason, data=data))

    def status(self) -> TargetStatus:
        spec = self.target.speculation
        return TargetStatus(
            name=self.name, backend=self.target.backend, endpoint=self.target.base_url,
            model=self.target.model,
            state=self.state.value, since=self.since,
            pid=self.process.pid if self.process and self.process.returncode is None else None,
            started_at=self.started_at, restarts=self.restarts,
            last_event=self.last_event.to_dict() if self.last_event else None,
            failure_output=self.failure_output, runtime=dict(self.runtime),
            speculation={"method": spec.method, "variant": spec.variant,
                         "enabled": self.tuner.speculation_on if spec.method != "none" else False,
                         "draft_length": self.tuner.draft_length if spec.method != "none" else None,
                         "tunable": self.backend.tunable_length() or (
                             "nothing to tune for this method" if spec.method != "none"
                             else None)},
            metrics=_metrics_view(self.metrics), tuning=self.tuner.view(),
            retunes=self.tuner.retunes, log_file=self.log_file, placement=dict(self.placement),
            resources=dict(self.resources), warnings=list(self.warnings),
            requests=dict(self.requests))

    # --- the owner task ---

    def _set_state(self, new: State, reason: str, detail: str | None = None,
                   **data: Any) -> None:
        if new == self.state:
            return
        if new not in ALLOWED[self.state]:
            raise RuntimeError(f"{self.name}: transition {self.state} -> {new} is not allowed")
        event = Event(self.name, "state", reason, self.state.value, new.value, detail, data)
        self.state, self.since, self.last_event = new, event.time, event
        if new in (State.READY, State.DEGRADED):
            self.serving.set()
        else:
            self.serving.clear()
        self.events.emit(event)

    async def run(self) -> None:
        want_running = True
        try:
            while True:
                if not want_running:
                    cmd = await self._commands.get()
                    if cmd.kind in ("shutdown", "detach"):
                        return
                    if cmd.kind == "retune":
                        # Decided just before the server stopped: it applies at the next start.
                        self.tuner.apply_pending()
                    elif cmd.kind in ("start", "restart"):
                        want_running, self._crash_times, self._oom_times = True, [], []
                        self._pending_reason = cmd.reason
                    continue
                outcome = await self._run_once()
                if isinstance(outcome, Command):
                    if outcome.kind in ("shutdown", "detach"):
                        return
                    want_running = outcome.kind != "stop"
                    continue
                want_running = await self._after_failure(outcome)
                if want_running is None:
                    return
        finally:
            if self.process is not None and self.process.returncode is None \
                    and not self._detached:
                self.process.kill()
                await self.process.wait()

    async def _after_failure(self, failure: Failure) -> bool | None:
        """Back off and restart, or give up. Returns whether to run again (None: shut down)."""
        now = self.clock()
        self._crash_times.append(now)
        fits_now, fit_detail = None, ""
        if failure.kind == FailureKind.OUT_OF_MEMORY:
            self._oom_times.append(now)
            if self.placer is not None:
                fits_now, fit_detail = await self.placer.fits_now(self.name)
        decision = policy.after_failure(failure, tuple(self._crash_times), now,
                                        self.target.restart, self.rand(),
                                        oom_times=tuple(self._oom_times), fits_now=fits_now,
                                        fit_detail=fit_detail)
        if decision.give_up:
            self._set_state(State.FAILED, decision.reason, self.failure_output,
                            failure=failure.kind.value)
            return False
        self._set_state(State.BACKOFF, decision.reason, self.failure_output,
                        failure=failure.kind.value, delay=round(decision.delay, 3))
        try:
            cmd = await asyncio.wait_for(self._commands.get(), timeout=decision.delay)
        except TimeoutError:
            self.restarts += 1
            self._pending_reason = f"restart after {failure.kind.value}"
            return True
        if cmd.kind in ("shutdown", "detach"):
            self._set_state(State.STOPPED, cmd.reason)
            return None
        if cmd.kind == "stop":
            self._set_state(State.STOPPED, cmd.reason)
            return False
        if cmd.kind == "retune":
            self.tuner.apply_pending()
        self._pending_reason = cmd.reason
        return True

    async def _run_once(self) -> Command | Failure:
        """Start the process and supervise it until it fails or a command interrupts it."""
        self._set_state(State.STARTING, self._pending_reason)
        try:
            started = await self._start()
            if isinstance(started, Failure):
                return started
            return await self._supervise(started)
        finally:
            if self.placer is not None:
                self.placer.released(self.name)

    async def _start(self) -> RunningProcess | Failure:
        try:
            info = await self.backend.preflight()
            await self._check_pairing()
            placement = await self.placer.check_start(self.name) if self.placer else None
            self.placement = ({"gpus": list(placement.gpus), "per_gpu": placement.per_gpu,
                               "memory_fraction": placement.memory_fraction}
                              if placement else {})
            self.tuner.runtime_started(info)
            spec = self.backend.launch_spec(self.tuner.draft_length,
                                            speculation=self.tuner.speculation_on,
                                            placement=placement)
            self.runtime = {"binary": info.binary, "version": info.version}
            grace = self.target.restart.stop_grace
            adopted, why = None, ""
            if self._may_adopt:
                self._may_adopt = False
                adopted, why = await self.launcher.adopt(self.name, spec, stop_grace=grace)
                if why and adopted is None:
                    self._event("adopt", why)
            if adopted is not None:
                self.process, self.started_at, self.failure_output = adopted, time.time(), None
                self._set_state(State.LOADING, why, pid=adopted.pid, adopted=True)
                return adopted
            proc = await self.launcher.start(self.name, spec, stop_grace=grace,
                                             on_line=self.backend.on_output)
        except StartRefused as exc:
            self.failure_output = None
            return Failure(FailureKind.REFUSED, str(exc), retryable=False)
        except SpecfleetError as exc:
            self.failure_output = None
            return Failure(FailureKind.BAD_ARGUMENTS, str(exc), retryable=False)
        except OSError as exc:
            self.failure_output = None
            return Failure(FailureKind.CRASH, f"could not start target '{self.name}': "
                           f"{exc.strerror or exc}", retryable=False)
        self.process, self.started_at, self.failure_output = proc, time.time(), None
        self._set_state(State.LOADING, f"pid {proc.pid} started", pid=proc.pid)
        if self.records is not None:
            spec_view = {"method": self.target.speculation.method,
                         "variant": self.target.speculation.variant,
                         "enabled": self.tuner.speculation_on,
                         "draft_length": self.tuner.draft_length}
            self.records.launched(self.name, proc.pid, self._pending_reason, spec, info,
                                  self.launcher_name, spec_view, self.placement,
                                  self.backend.model_files())
        return proc

    async def _drain(self, timeout: float) -> None:
        """Before a planned restart: let requests the proxy is relaying finish (new ones wait,
        since the target is no longer serving), for at most `timeout` seconds."""
        deadline = self.clock() + timeout
        while self.inflight > 0 and self.clock() < deadline:
            await asyncio.sleep(0.05)

    async def _check_pairing(self) -> None:
        """The pairing guard before every start (cached per file, so cheap after the first)."""
        findings = await asyncio.to_thread(self.backend.pairing_findings)
        errors = [f.message for f in findings if f.level == "error"]
        if errors:
            raise StartRefused("; ".join(errors))
        warnings = [f.message for f in findings if f.level == "warning"]
        if warnings != self.warnings:
            for message in warnings:
                self._event("pairing", message, level="warning")
        self.warnings = warnings

    async def _supervise(self, proc: RunningProcess) -> Command | Failure:
        exit_task = asyncio.create_task(proc.wait())
        command_task = asyncio.create_task(self._commands.get())
        health_task = asyncio.create_task(self._watch_health())
        metrics_task = asyncio.create_task(self._poll_metrics())
        try:
            done, _ = await asyncio.wait({exit_task, command_task, health_task},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (health_task, metrics_task):
                task.cancel()
            if not command_task.done():
                command_task.cancel()
        if command_task in done and not command_task.cancelled():
            cmd = command_task.result()
            if cmd.kind == "detach":
                self._detached = True
                self._set_state(State.DETACHED, f"{cmd.reason}; left running (pid {proc.pid})")
                return cmd
            if cmd.kind == "retune":
                self.tuner.apply_pending()
            self._set_state(State.STOPPING, cmd.reason)
            if cmd.kind in ("restart", "retune"):
                await self._drain(self.target.restart.stop_grace)
            await proc.stop(self.target.restart.stop_grace)
            if cmd.kind not in ("restart", "retune"):
                self._set_state(State.STOPPED, f"stopped ({cmd.reason})")
            self._pending_reason = cmd.reason
            return cmd
        if health_task in done:
            failure = health_task.result()
            proc.kill()
            await exit_task
        else:
            code = exit_task.result()
            tail = proc.output_tail()
            if proc.oom_killed():
                return self._oom_killed(proc)
            failure = self.backend.explain_failure(tail, code) or Failure(
                FailureKind.CRASH, f"{self.backend.description or self.target.backend} "
                                   f"{_exit_description(code)}")
        self.failure_output = proc.output_tail() or None
        return failure

    def _oom_killed(self, proc: RunningProcess) -> Failure:
        self.failure_output = proc.output_tail() or None
        return Failure(FailureKind.OUT_OF_MEMORY, "out of host memory: killed by the kernel's "
                       "OOM killer (SIGKILL, and oom_kill rose in its cgroup's memory.events)")

    async def _watch_health(self) -> Failure:
        """Probe until the process looks hung or never finishes loading; return why."""
        health = self.target.health
        liveness = policy.LivenessTracker(health)
        deadline = self.clock() + health.start_timeout
        while True:
            problem = None
            try:
                async with asyncio.timeout(health.timeout):
                    probe = await self.backend.probe(self.http)
            except TimeoutError:
                problem = f"no answer to a health check within {health.timeout:g}s"
            except aiohttp.ClientError as exc:
                # Before the runtime binds its port, refusal is normal.
                if self.state != State.LOADING:
                    problem = f"health check failed: {exc}"
            else:
                if probe.readiness == Readiness.READY:
                    liveness.ok()
                    if self.state == State.LOADING and self.placer is not None:
                        self.placer.released(self.name)  # its memory now shows in NVML
                    if self.state in (State.LOADING, State.DEGRADED):
                        took = time.time() - (self.started_at or time.time())
                        self._set_state(State.READY, "health check passed" + (
                            f" after {took:.1f}s" if self.state == State.LOADING else ""))
                elif probe.readiness == Readiness.UNHEALTHY or self.state != State.LOADING:
                    problem = f"unhealthy: {probe.detail}"
            if problem is not None:
                if liveness.failed():
                    return Failure(FailureKind.HANG, f"{problem}; {liveness.consecutive} failed "
                                   "health checks in a row while the process is alive: "
                                   "treating it as hung")
                if self.state == State.READY:
                    self._set_state(State.DEGRADED, problem)
            if self.state == State.LOADING and self.clock() > deadline:
                return Failure(FailureKind.START_TIMEOUT, "not ready within start_timeout "
                               f"({health.start_timeout:g}s)")
            # Poll quickly while loading so that ready is seen promptly.
            await asyncio.sleep(min(health.interval, 0.5) if self.state == State.LOADING
                                else health.interval)

    async def _poll_metrics(self) -> None:
        interval = self.target.health.metrics_interval
        while True:
            await asyncio.sleep(interval)
            if self.state not in (State.READY, State.DEGRADED):
                continue
            with contextlib.suppress(TimeoutError, aiohttp.ClientError, ValueError):
                async with asyncio.timeout(self.target.health.timeout):
                    sample = await self.backend.read_metrics(self.http)
                if sample is not None:
                    self.metrics = sample
                    try:
                        if reason := self.tuner.observe(sample):
                            self.send("retune", reason)
                    except Exception as exc:  # a bug here must not stop supervision
                        self._event("error", f"tuning skipped after an internal error: {exc!r}")


def _metrics_view(m: MetricsSample | None) -> dict[str, Any]:
    if m is None:
        return {}
    return {"drafts": m.drafts, "draft_tokens": m.draft_tokens,
            "accepted_tokens": m.accepted_tokens,
            "acceptance_rate": round(m.acceptance_rate, 4) if m.acceptance_rate else None,
            "accepted_per_position": list(m.accepted_per_position),
            "tokens_predicted": m.tokens_predicted,
            "tokens_per_second": round(m.tokens_per_second, 2) if m.tokens_per_second else None,
            "requests_processing": m.requests_processing}
