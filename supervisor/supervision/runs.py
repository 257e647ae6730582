"""What one target runs and what the rest of the daemon sees of it (owner.py's base): its
`definition` and its latest `server` (server.py), each replaced whole and only here; its
state and the parts others read (the proxy's `requests`, the on-demand book `loading`);
the views that the fleet, the proxy (served.py) and the status (snapshot.py) read
(`target`, `backend`, `process`, ...); and `send`, the one way to ask it for anything.

`_serve` is the one place the server changes: at each start in place, and when the
handover (handover.py) switches to a server started beside the old one, with a reload's
new definition where there is one. What status shows of a server (its counters, memory,
speed) is from then on the new one's, never the previous process's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from supervisor.config.schema import Target
from supervisor.events import Event, EventBus
from supervisor.gpu.placement import Placer
from supervisor.plugin.backend import Backend, MetricsSample
from supervisor.plugin.launching import Launcher, RunningProcess
from supervisor.registry.modelkits import ModelKits
from supervisor.supervision.commands import Command, Request
from supervisor.supervision.crashes import CrashHistory
from supervisor.supervision.explain import PairingWarnings
from supervisor.supervision.handover import may_go_beside
from supervisor.supervision.ondemand import OnDemandBook
from supervisor.supervision.pulling import KitPuller
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.runrecord import RunRecorder
from supervisor.supervision.server import Definition, Server
from supervisor.supervision.states import State, StateChanges, is_live
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.store import TuningStore


class TargetRuns:
    def __init__(self, target: Target, backend: Backend, launcher: Launcher, events: EventBus,
                 *, clock: Callable[[], float], rand: Callable[[], float],
                 log_file: str | None, tuning_store: TuningStore | None,
                 placer: Placer | None, records: RunRecorder | None, kits: ModelKits | None,
                 proxied: bool, start_reason: str) -> None:
        self._name = target.name
        self.events = events
        self.clock, self.rand = clock, rand
        self.placer, self.records, self.kits = placer, records, kits
        self.tuning_store = tuning_store
        self.proxied = proxied  # the daemon's proxy is on: clients reach the target through it
        self.last_event: Event | None = None  # the latest event of this target, any kind
        self.definition = self.define(target, backend, launcher, log_file)
        self.crashes = CrashHistory(target, placer, clock, rand)
        self.server: Server | None = None  # the latest start (its process may have ended)
        self.metrics: MetricsSample | None = None  # the server's counters, last read
        self.resources: dict[str, Any] = {}  # the server's memory and CPU (the monitor's)
        self.failure_output: str | None = None
        self.changes = StateChanges()  # the proxy's waiters, the on-demand loader's
        self.pending_reason = start_reason  # the reason the next start will carry
        self._may_adopt = launcher.traits.detaches  # only the first start may find a running unit
        self.state, self.since = State.STOPPED, time.time()
        self.state_event: Event | None = None  # the latest state change: why it is so
        self.wanted = True  # the owner means to run it (served.py)
        self.pairing = PairingWarnings(self._event)  # the pairing guard's, said once each
        self.requests = ProxyRequests()  # the proxy's requests to this target: it owns them
        self.loading = OnDemandBook(lambda: self.target, lambda: self.state, self._event,
                                    self.changes, self.requests, lambda: self.started_at)
        self._commands: asyncio.Queue[Request] = asyncio.Queue()  # the owner task's inbox

    @property
    def name(self) -> str:
        return self._name

    @property
    def serving(self) -> bool:
        return is_live(self.state)

    def send(self, command: Command, reason: str) -> None:
        self._commands.put_nowait(Request(command, reason))

    def redefine(self, definition: Definition, reason: str, unloaded: bool = False) -> None:
        """Run `definition` from now on (a reload changed the target): beside the serving
        server where it may, as a retune's restart, else in place; `unloaded`: if it does
        not serve now, it waits for a request to load."""
        self._commands.put_nowait(Request(Command.REDEFINE, reason, definition, unloaded))
    def define(self, target: Target, backend: Backend, launcher: Launcher,
               log_file: str | None = None, puller: KitPuller | None = None) -> Definition:
        """A definition of this target to run: `backend` on the configured port, a tuner of
        its own (its memory is the model file's), the ModelKit's pull (`puller`: one that
        pulled already). What a reload sends with REDEFINE (`redefine`)."""
        tuner = AutoTuner(target, backend, self.tuning_store, self._event, self.clock,
                          restart_is_free=may_go_beside(target, launcher, self.proxied))
        return Definition(target, backend, launcher, tuner,
                          puller or KitPuller(target.name, self.kits,
                                              lambda reason, **data: self._event(
                                                  "modelkit", reason, **data)),
                          log_file)

    # --- what it runs, read through its two values ---

    @property
    def target(self) -> Target:
        return self.definition.target

    @property
    def home(self) -> Backend:
        return self.definition.home

    @property
    def launcher(self) -> Launcher:
        return self.definition.launcher

    @property
    def tuner(self) -> AutoTuner:
        return self.definition.tuner

    @property
    def log_file(self) -> str | None:
        return self.definition.log_file

    @property
    def kit(self) -> dict[str, Any] | None:
        """What its ModelKit pulled (provenance), and the pull under way."""
        return self.definition.puller.kit

    @property
    def backend(self) -> Backend:
        """The backend of the server that serves now (a handover moves it), else home."""
        return self.server.backend if self.server is not None else self.home

    @property
    def process(self) -> RunningProcess | None:
        return self.server.process if self.server is not None else None

    @property
    def started_at(self) -> float | None:
        return self.server.started_at if self.server is not None else None

    @property
    def runtime(self) -> dict[str, str]:
        return self.server.runtime if self.server is not None else {}

    @property
    def placement(self) -> dict[str, Any]:
        return self.server.placement if self.server is not None else {}

    def seen_using(self, usage: dict[str, Any]) -> None:
        """What the monitor read of its server's memory and CPU ({}: nothing runs)."""
        self.resources = usage

    def _event(self, kind: str, reason: str, **data: Any) -> None:
        event = Event(self.name, kind, reason, data=data)
        self.last_event = event
        self.events.emit(event)

    def _redefine(self, definition: Definition) -> None:
        """The reload's definition from now on, its restarts counted afresh (a new one may
        have another restart policy); no unit of the old one is left to adopt."""
        self.definition = definition
        self.crashes = CrashHistory(self.target, self.placer, self.clock, self.rand)
        self._may_adopt = False
        self.server = None  # the next start listens where the new definition says

    def _at_files(self, pulled: Target) -> None:
        """The definition at its ModelKit's pulled files (the same when it has none, or was
        pulled before): a tuner of their own, the pull's provenance kept."""
        if pulled is self.target:
            return
        d = self.definition
        self.definition = self.define(pulled, d.home.with_target(pulled), d.launcher,
                                      d.log_file, d.puller)
        self.server = None  # listens where the definition says

    def _serve(self, server: Server, definition: Definition) -> None:
        """The one place the owner's server changes (a start, or a server started beside the
        old one: handover.py), and with it a reload's definition: what status shows of a
        server from here on is this one's, never the previous process's."""
        if definition is not self.definition:
            self._redefine(definition)
        self.server, self.failure_output = server, None
        self.metrics = None  # the previous process's counters are not this one's
        self.resources = {}  # nor its memory (the monitor reads this one's next)
        if not server.adopted:
            self._record_launch(server)
        self.changes.wake()

    def _record_launch(self, server: Server) -> None:
        """The run record of a server that was started (in place or beside)."""
        if self.records is None:
            return
        tuner = self.tuner
        spec_view = {"method": self.target.speculation.method, "variant": tuner.variant,
                     "enabled": tuner.speculation_on, "draft_length": tuner.draft_length}
        self.records.launched(self.name, server.process.pid, self.pending_reason, server.spec,
                              server.runtime, self.target.launcher, spec_view,
                              server.placement, server.backend.model_files(), self.kit)
