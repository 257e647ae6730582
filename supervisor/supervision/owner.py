"""TargetSupervisor: one asyncio task owns one target's state. Everything else sends it
commands (supervision/commands.py) through a queue; only the owner task changes the state,
through `_set_state`, which checks the transition against ALLOWED (supervision/states.py),
drops no-op transitions and emits an event. In each of its phases (idle or unloaded,
backing off, running) it waits for a command and asks `commands.next_step` what it means.

What it runs is two values it replaces whole (server.py): its `definition` (a reload's
REDEFINE, or a ModelKit pulled to its files) and its `server` (each start, each server
started beside the old one: `_serve`). Its parts (the handover, the ModelKit's pull, the
on-demand book, the proxy's requests, the tuner) keep their own state and change nothing
of the owner's.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.config.schema import Target
from supervisor.errors import Lacking, NotReachableYet, SpecfleetError, StartRefused, Untrusted
from supervisor.events import Event, EventBus
from supervisor.gpu.placement import Placer
from supervisor.plugin.backend import Backend, Failure, FailureKind, MetricsSample
from supervisor.plugin.launching import Launcher, RunningProcess, local_pid
from supervisor.registry.modelkits import ModelKits
from supervisor.supervision.calibration import Calibrating
from supervisor.supervision.commands import (
    Command,
    Next,
    Phase,
    Request,
    counts_as_restart,
    is_planned_restart,
    next_step,
    step_for,
)
from supervisor.supervision.explain import explain_exit, explain_hang
from supervisor.supervision.handover import (
    Handover,
    in_place_reason,
    reload_in_place_reason,
    room_beside,
)
from supervisor.supervision.neighbours import Worker, work_beside
from supervisor.supervision.probes import HealthWatch, QuietRuntime, poll_metrics, tree_cpu_seconds
from supervisor.supervision.runrecord import RunRecorder
from supervisor.supervision.runs import TargetRuns
from supervisor.supervision.served import Served
from supervisor.supervision.server import Definition
from supervisor.supervision.snapshot import snapshot
from supervisor.supervision.start import launch, start_failure
from supervisor.supervision.states import ALLOWED, State, is_live
from supervisor.supervision.status import TargetStatus
from supervisor.supervision.waiting import Wait, lacking, port_taken
from supervisor.tuning.store import TuningStore


class TargetSupervisor(TargetRuns):
    """The owner of one target: its loop, on what it runs (runs.TargetRuns), composed of
    collaborators with their own state: what the proxy sees of it (`served`), its on-demand
    book (`loading`), the proxy's requests (`requests`), the servers started beside
    (`handover`), and its definition's tuner and ModelKit pull; the health and metrics
    loops run per process (probes.py)."""

    def __init__(self, target: Target, backend: Backend, launcher: Launcher, events: EventBus,
                 http: aiohttp.ClientSession, *, clock: Callable[[], float] = time.monotonic,
                 rand: Callable[[], float] = random.random, log_file: str | None = None,
                 tuning_store: TuningStore | None = None, placer: Placer | None = None,
                 records: RunRecorder | None = None, kits: ModelKits | None = None,
                 start_reason: str = "daemon started", unloaded: bool = False,
                 proxied: bool = False,
                 neighbours: Callable[[], Iterable[Worker]] = tuple) -> None:
        super().__init__(target, backend, launcher, events, clock=clock, rand=rand,
                         log_file=log_file, tuning_store=tuning_store, placer=placer,
                         records=records, kits=kits, proxied=proxied,
                         start_reason=start_reason)
        # The fleet's other owners: a calibration beside this target gives way to their
        # work on the same device too (neighbours.py).
        self.neighbours = neighbours
        self.http = http
        self.handover = Handover(target.name, http, self.requests, placer, self.pairing,
                                 lambda reason, **data: self._event("replace", reason, **data))
        self._detached = False  # DETACH left the process running: the end must not kill it
        self._task: asyncio.Task[None] | None = None
        self._start_unloaded = unloaded  # on demand: wait for the first request
        self._looks = 0  # looks again while waiting (waiting.py), for its backoff
        self.served = Served(self)
        self.calibrating = Calibrating(self._event)  # the tuner's calibration beside

    # --- the API other tasks use ---

    def start_owner_task(self) -> asyncio.Task[None]:
        """Start the owner task; the target starts at once."""
        self._task = asyncio.create_task(self.run(), name=f"target:{self.name}")
        return self._task

    def status(self) -> TargetStatus:
        return snapshot(self)

    async def shutdown(self, reason: str) -> None:
        """Stop the process and end the owner task."""
        await self._end(Command.SHUTDOWN, reason)

    async def detach(self, reason: str) -> None:
        """End the owner task and leave the target running (a systemd unit, adopted by the
        next daemon)."""
        await self._end(Command.DETACH, reason)

    async def _end(self, command: Command, reason: str) -> None:
        if self._task is not None and not self._task.done():
            self.send(command, reason)
            await self._task

    def _set_state(self, new: State, reason: str, detail: str | None = None,
                   **data: Any) -> None:
        if new == self.state:
            return
        if new not in ALLOWED[self.state]:
            raise RuntimeError(f"{self.name}: transition {self.state} -> {new} is not allowed")
        if self.state == State.LOADING and self.placer is not None:
            self.placer.released(self.name)  # loaded (its memory now shows in NVML), or gone
        if self.state == State.LOADING and new == State.READY and self.started_at:
            self.tuner.restarted(time.time() - self.started_at, beside=False)
        if not is_live(new):
            self.calibrating.cancel()  # nothing to calibrate beside while it does not serve
        event = Event(self.name, "state", reason, self.state.value, new.value, detail, data)
        self.state, self.since = new, event.time
        self.last_event = self.state_event = event
        self.loading.state_changed(new)
        self.changes.wake()
        self.events.emit(event)

    async def run(self) -> None:
        step = Next.RUN
        if self._start_unloaded:
            self._set_state(State.UNLOADED, f"{self.pending_reason}; loads on demand")
            step = Next.IDLE
        try:
            while step is not Next.EXIT:
                try:
                    step = await self._step(step)
                except Exception as exc:  # a bug, or a runtime error nobody foresaw
                    step = await self._internal_error(exc)
        finally:
            if not self._detached:
                await self._kill_process()

    async def _kill_process(self) -> None:
        await self.calibrating.stop()
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        await self.handover.stop_all()

    async def _step(self, step: Next) -> Next:
        if step in (Next.IDLE, Next.UNLOADED):
            return self._dispatch(await self._commands.get(), Phase.IDLE)
        if step is Next.SERVE:  # a server started beside the old one took over
            assert self.process is not None
            outcome = await self._supervise(self.process)
        else:
            outcome = await self._run_once()
        if isinstance(outcome, Failure):
            outcome = await self._after_failure(outcome)
        return await self._wait(outcome) if isinstance(outcome, Wait) else outcome

    async def _internal_error(self, exc: Exception) -> Next:
        """The last line of defence: this target (only) ends `failed` with the exception's
        text, its process killed; a restart command tries again."""
        self.wanted = False
        await self._kill_process()
        self._event("error", f"internal error in target {self.name!r}: {exc!r}")
        if State.FAILED not in ALLOWED[self.state]:  # stopped or failed already: not transient
            return Next.IDLE
        self._set_state(State.FAILED, f"internal error: {exc!r}; not restarting (restart it "
                        "through the API or reload once the cause is fixed)",
                        failure="internal_error")
        return Next.IDLE

    def _dispatch(self, request: Request, phase: Phase) -> Next:
        """The one place a command takes effect on the owner's plans (commands.py's table).
        A REDEFINE while a process runs is `_redefine_running`'s, and adopted by it."""
        step = step_for(phase, request)
        redefined = request.command is Command.REDEFINE
        if redefined and phase is not Phase.RUNNING:
            assert request.definition is not None
            self._redefine(request.definition)
        # Unloaded comes back on demand; a failed target stays failed (and not wanted), but
        # for a new definition.
        self.wanted = step is Next.RUN or (step is Next.UNLOADED and (
            self.state != State.FAILED or redefined))
        if request.command is Command.RETUNE:
            self.tuner.apply_pending()
        if step is Next.RUN:
            self.pending_reason = request.reason
            self.loading.started(on_demand=request.command is Command.START)
            if counts_as_restart(request.command):
                self.crashes.count(request.command.value)
            if phase is Phase.IDLE:  # a manual start after giving up counts crashes anew
                self.crashes.forget()
        elif step is Next.UNLOADED and (self.state is State.STOPPED or (
                redefined and self.state is State.FAILED and phase is Phase.IDLE)):
            self._set_state(State.UNLOADED, request.reason)
        return step

    async def _after_failure(self, failure: Failure) -> Next | Wait:
        """Back off and restart, or give up; a port another program holds is waited for."""
        if failure.kind is FailureKind.PORT_IN_USE and State.WAITING in ALLOWED[self.state]:
            host, port = self.backend.target.host, self.backend.target.port
            return Wait(failure.summary, failure.kind.value, lambda: port_taken(host, port))
        decision = await self.crashes.decide(failure)
        if decision.give_up:
            self.wanted = False
            self._set_state(State.FAILED, decision.reason, self.failure_output,
                            failure=failure.kind.value)
            return Next.IDLE
        self._set_state(State.BACKOFF, decision.reason, self.failure_output,
                        failure=failure.kind.value, delay=round(decision.delay, 3))
        try:
            request = await asyncio.wait_for(self._commands.get(), timeout=decision.delay)
        except TimeoutError:
            self.crashes.count(failure.kind.value, by_policy=True)
            self.pending_reason = f"restart after {failure.kind.value}"
            return Next.RUN
        return self._stopped_by(request, request.reason)

    async def _wait(self, wait: Wait) -> Next:
        """Wait for what the host lacks (waiting.py): look again, with backoff and without
        end, until it is there (then start) or a command comes. A target being loaded for a
        request goes back to unloaded instead, its waiting requests answered with the reason:
        an on-demand target is looked at again when it is asked for, not loaded unasked."""
        if self.loading.demanded:
            self.loading.refuse_load(f"{self.name} cannot load: {wait.reason}")
            self._set_state(State.UNLOADED, wait.reason, failure=wait.failure)
            return Next.UNLOADED
        restart = self.target.restart
        self._set_state(State.WAITING, wait.said(self._looks, restart), self.failure_output,
                        failure=wait.failure)
        while True:
            try:
                request = await asyncio.wait_for(self._commands.get(),
                                                 wait.delay(self._looks, restart))
            except TimeoutError:
                self._looks += 1  # kept across the starts tried again: the backoff grows
                if wait.still is None:  # only a start can tell (a registry, a cluster)
                    self.pending_reason = f"trying again: {wait.reason}"
                    return Next.RUN
                still = await asyncio.to_thread(wait.still)
                if still is None:
                    self.pending_reason = f"no longer waiting for: {wait.reason}"
                    return Next.RUN
                if still != wait.reason:  # another lack now (the model came, the draft not)
                    wait = Wait(still, wait.failure, wait.still)
                    self._event("waiting", wait.said(self._looks, restart))
                continue
            self._looks = 0
            return self._stopped_by(request, request.reason)

    def _stopped_by(self, request: Request, reason: str) -> Next:  # while no process runs
        step = self._dispatch(request, Phase.BACKOFF)
        if step is not Next.RUN:
            self._set_state(State.UNLOADED if step is Next.UNLOADED else State.STOPPED, reason)
        return step

    async def _run_once(self) -> Next | Failure | Wait:
        """Start the process and supervise it until it fails or a command interrupts it."""
        self._set_state(State.STARTING, self.pending_reason)
        try:
            try:
                pulled = await self.definition.puller.pull_or_command(self.target,
                                                                      self._commands.get)
                if isinstance(pulled, Request):
                    return self._stopped_by(pulled, f"{pulled.reason} (while the ModelKit "
                                            "was pulled)")
                self._at_files(pulled)
                started = await self._launch()
            except Lacking as exc:  # a file, a binary: looked at again without a start
                backend = self.backend
                return Wait(str(exc), "missing", lambda: lacking(backend))
            except NotReachableYet as exc:  # a registry, a cluster: only a start can tell
                return Wait(str(exc), FailureKind.UNREACHABLE.value)
            except (StartRefused, SpecfleetError, OSError) as exc:
                self.failure_output = None
                return start_failure(self.name, exc)  # a start that cannot succeed: final
            return await self._supervise(started)
        finally:
            if self.placer is not None:
                self.placer.released(self.name)

    async def _launch(self) -> RunningProcess:
        """Preflight, pairing guard, placement; adopt a unit or start anew. On the port of
        the latest server of this definition (moved by a handover), else the configured one."""
        backend = self.server.backend if self.server is not None else self.home
        server, why = await launch(self.name, backend, self.definition, self.placer,
                                   self.pairing, may_adopt=self._may_adopt)
        self._may_adopt = False  # only the first start may find a running unit
        if not server.adopted and why:
            self._event("adopt", why)
        self._serve(server, self.definition)
        self._looks = 0  # what it waited for is there: a later wait starts afresh
        proc = server.process
        if server.adopted:
            self._set_state(State.LOADING, why, pid=proc.pid, adopted=True)
        else:
            self._set_state(State.LOADING, f"pid {proc.pid} started", pid=proc.pid)
        return proc

    async def _supervise(self, proc: RunningProcess) -> Next | Failure:
        """Until the process exits, looks hung, or a command stops it."""
        health = HealthWatch(self.target.health, lambda: self.backend.probe(self.http),
                             lambda: self.state, self._set_state, self.clock,
                             lambda: tree_cpu_seconds(local_pid(proc)))
        exit_task = asyncio.create_task(proc.wait())
        health_task = asyncio.create_task(
            health.run(lambda: time.time() - (self.started_at or time.time())))
        metrics_task = asyncio.create_task(poll_metrics(
            self.target.health, lambda: self.backend.read_metrics(self.http), lambda: self.serving,
            self._on_sample, QuietRuntime(local_pid(proc), self.requests.mark, self.tuner.by_load.quiet)))
        command_task = asyncio.create_task(self._command_while_serving())
        try:
            done, _ = await asyncio.wait({exit_task, command_task, health_task},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (health_task, metrics_task, command_task):
                if not task.done():
                    task.cancel()
        if command_task in done:
            return await self._command_while_running(proc, command_task.result())
        if health_task in done:
            failure = explain_hang(self.backend, proc, health_task.result())
            proc.kill()
            await exit_task
        else:
            failure = explain_exit(self.backend, proc, exit_task.result())
        self.failure_output = proc.output_tail() or None
        return failure

    async def _command_while_serving(self) -> Request:
        """The next command that changes something for a running process (not START)."""
        while True:
            request = await self._commands.get()
            if next_step(Phase.RUNNING, request.command) is not Next.KEEP:
                return request

    async def _command_while_running(self, proc: RunningProcess, request: Request) -> Next:
        if request.command is Command.RESTART and \
                (why := await asyncio.to_thread(lacking, self.backend)) is not None:
            # A restart that could not start again must not end the server that serves: its
            # model is loaded, whatever became of the file (a NAS gone, a copy under way).
            # Not counted as a restart; a retune still goes ahead (the tuner decided it).
            self._event("restart", f"{request.reason}: not done, the running server (pid "
                        f"{proc.pid}) keeps serving: {why}; ask again once it is there",
                        refused=True)
            return Next.SERVE
        if request.command is Command.REDEFINE:
            return await self._redefine_running(proc, request)
        step = self._dispatch(request, Phase.RUNNING)
        if request.command is Command.DETACH:
            self._detached = True
            self._set_state(State.DETACHED, f"{request.reason}; left running (pid {proc.pid})")
            return step
        if step is Next.RUN and request.command in (Command.RETUNE, Command.RESTART):
            why = in_place_reason(self.target.restart.replace, self.launcher.traits.beside,
                                  self.target.launcher, self.proxied)
            outcome = await self._beside(proc, self.definition, request.reason, why)
            if outcome is not None:
                return outcome
        return await self._stop(proc, request, step, self.target.restart.stop_grace)

    async def _beside(self, proc: RunningProcess, definition: Definition, reason: str,
                      why_in_place: str | None, redefine: Request | None = None) -> Next | None:
        """A server of `definition` started beside the serving one (handover.py): SERVE once
        it took over, the step of a command that came while it loaded, or None: in place.
        For a reload's `redefine`, a restart asked meanwhile is the one under way: the new
        definition is started again, never dropped for the old one's restart."""
        assert self.server is not None
        outcome = await self.handover.replace(self.server, definition, reason, why_in_place,
                                              self._command_while_serving, self._serve)
        if isinstance(outcome, Request):  # a command came while the new server loaded
            if redefine is not None and next_step(Phase.RUNNING, outcome.command) is Next.RUN \
                    and outcome.command is not Command.REDEFINE:
                return await self._redefine_running(proc, redefine)
            return await self._command_while_running(proc, outcome)
        return Next.SERVE if outcome else None

    async def _redefine_running(self, proc: RunningProcess, request: Request) -> Next:
        """A reload changed the target while a process runs: its new definition beside the
        serving server where it may (a ModelKit pulled first, while the old one serves),
        else the old server stops (its requests finished, at most the new
        `health.start_timeout`) and the new definition starts in its place, or waits
        unloaded (`request.unloaded`)."""
        new = request.definition
        assert new is not None
        why = reload_in_place_reason(self.target, self.state, new.target,
                                     new.launcher.traits.beside, self.proxied)
        if why is None:
            try:
                pulled = await new.puller.pull_or_command(new.target,
                                                          self._command_while_serving)
            except Untrusted as exc:  # never a reason to stop what serves
                self._event("replace", f"{request.reason}: not applied, the running server "
                            f"(pid {proc.pid}) keeps serving: {exc}", replace="refused")
                return Next.SERVE
            except SpecfleetError as exc:  # and NotReachableYet: the start in place says so
                pulled, why = new.target, f"its ModelKit was not pulled beside: {exc}"
            if isinstance(pulled, Request):  # a later command instead (a shutdown, a reload)
                return await self._command_while_running(proc, pulled)
            if why is None:
                if pulled is not new.target:  # at its ModelKit's files
                    new = self.define(pulled, new.home.with_target(pulled), new.launcher,
                                      new.log_file, new.puller)
                outcome = await self._beside(proc, new, request.reason, None, request)
                if outcome is not None:
                    return outcome
        if why is not None and self.serving:
            self._event("replace", f"restarting in place after the reload: {why}",
                        replace="in_place")
        step = step_for(Phase.RUNNING, request)
        self.wanted = True  # unloaded too: it comes back on demand
        self.pending_reason = request.reason
        if step is Next.RUN:
            self.loading.started(on_demand=False)
        return await self._stop(proc, request, step, new.target.health.start_timeout)

    async def _stop(self, proc: RunningProcess, request: Request, step: Next,
                    drain: float) -> Next:
        """The running process stops for `request`; a planned restart first lets the
        requests in flight finish (at most `drain` seconds). A REDEFINE's definition is
        the owner's once the old server is gone."""
        self._set_state(State.STOPPING, request.reason)
        if is_planned_restart(request.command):
            # New requests wait (the target is no longer serving); those in flight finish.
            await self.requests.drained(drain)
        await proc.stop(self.target.restart.stop_grace)
        # The calibration beside was cancelled at `stopping`; its server is gone too before
        # the state says no server of this target runs (unloaded, stopped).
        await self.calibrating.stop()
        if request.command is Command.REDEFINE:
            assert request.definition is not None
            self._redefine(request.definition)
        if step is Next.UNLOADED:
            self._set_state(State.UNLOADED, request.reason)
        elif step is not Next.RUN:
            self._set_state(State.STOPPED, f"stopped ({request.reason})")
        return step

    def _on_sample(self, sample: MetricsSample) -> None:
        self.metrics = sample
        try:
            r = self.requests
            if reason := self.tuner.observe(sample, r.take_peak(), r.take_busy(), r.take_classes()):
                self.send(Command.RETUNE, reason)
            if self.serving:
                work = Path(self.log_file).parent if self.log_file else Path(tempfile.gettempdir())
                # A second server of this target on this machine: where its launcher can run
                # two (the process launcher); nothing is routed to it, so the proxy and
                # restart.replace do not matter.
                self.calibrating.maybe_start(
                    self.target, self.backend, self.tuner, work,
                    lambda: room_beside(self.placer, self.backend),
                    None if self.launcher.traits.beside else
                    f"the {self.target.launcher} launcher runs one server of a target",
                    lambda: work_beside(self, self.neighbours))
        except Exception as exc:  # a bug here must not stop supervision
            self._event("error", f"tuning skipped after an internal error: {exc!r}")
