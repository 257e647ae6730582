"""The daemon: one TargetSupervisor per target, signals, reload, the status file.

Signal handlers only record what arrived; the main loop acts on it (uvicorn's
pattern), so a handler never runs in the middle of a state change.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from supervisor import __version__
from supervisor.api.proxy import Proxy
from supervisor.api.server import ApiServer, read_api_token
from supervisor.config.loader import LoadedFleet, load_fleet
from supervisor.config.schema import Fleet, Target
from supervisor.daemon import statusfile
from supervisor.daemon.logs import get_logger
from supervisor.daemon.notify import Notifier
from supervisor.errors import FleetFileError, SpecfleetError
from supervisor.events import Event, EventBus, EventLog
from supervisor.gpu.monitor import HeadroomAlert, ResourceMonitor
from supervisor.gpu.placement import Placer, held_vram
from supervisor.launcher.base import Launcher
from supervisor.launcher.external import ExternalLauncher
from supervisor.launcher.process import ProcessLauncher
from supervisor.launcher.systemd import units
from supervisor.launcher.systemd.launcher import SystemdLauncher
from supervisor.plugin.registry import BackendRegistry
from supervisor.target.runrecord import RunRecorder
from supervisor.target.supervisor import TargetSupervisor
from supervisor.tuning.decisions import TuningStore

STATUS_REFRESH = 5.0  # seconds between status-file rewrites when nothing happens


class Daemon:
    def __init__(self, fleet_path: Path, loaded: LoadedFleet, registry: BackendRegistry) -> None:
        self.fleet_path = fleet_path
        self.fleet: Fleet = loaded.fleet
        self.registry = registry
        self.events = EventBus()
        self.log = get_logger()
        settings = self.fleet.daemon
        self.state_dir = Path(settings.state_dir).expanduser()
        self.launcher = ProcessLauncher(settings.logs.expanduser(), self.state_dir,
                                        settings.log_max_bytes, settings.log_backups)
        self.systemd = SystemdLauncher(settings.systemd, self.state_dir)
        self.external = ExternalLauncher()
        self.notifier = Notifier()
        self._ready_sent = False
        self._reload_lock = asyncio.Lock()
        self.api = ApiServer(self)
        self.proxy = Proxy(self)
        self.supervisors: dict[str, TargetSupervisor] = {}
        self.tuning_store = TuningStore(self.state_dir / "tuning.json")
        self.placer = Placer(settings.gpu)
        self.records = RunRecorder(self.state_dir)
        self.monitor = ResourceMonitor(settings.gpu, self._running_pids, self._publish_usage,
                                       self._headroom_alert)
        self._signals: asyncio.Queue[int] = asyncio.Queue()
        self._http: aiohttp.ClientSession | None = None
        self._started = time.time()
        self._create_time = psutil.Process().create_time()
        self.events.subscribe(self._log_event)
        self.events.subscribe(lambda _: self.write_status())

    # --- lifecycle ---

    async def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._single_instance(), EventLog(self.state_dir / "events.jsonl") as event_log:
            self.events.subscribe(event_log.append)
            if killed := self.launcher.sweep_orphans():
                self.log.warning("killed processes left by a daemon that died uncleanly",
                                 processes=killed)
            if self._uses_systemd(self.fleet):
                await self.systemd.connect()
                await self._remove_leftover_units(self.fleet)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.add_signal_handler(sig, self._signals.put_nowait, sig)
            # Connection: close on every probe: an idle keep-alive connection would tie up
            # one of llama-server's few HTTP worker threads.
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            monitor: asyncio.Task[None] | None = None
            watchdog: asyncio.Task[None] | None = None
            try:
                self.emit("daemon", f"specfleet {__version__} started with {self.fleet_path} "
                          f"({len(self.fleet.targets)} targets)")
                await self._plan(self.fleet)
                await self._listen()
                monitor = asyncio.create_task(self.monitor.run(), name="monitor")
                watchdog = asyncio.create_task(self._watchdog(), name="watchdog")
                for target in self.fleet.targets.values():
                    self._add(target)
                # The first reconcile is done: every target is started, adopted or refused.
                # Models may still be loading; READY=1 does not wait for them (minutes).
                await asyncio.sleep(0)
                self._ready_sent = self.notifier.ready(self.summary())
                await self._main_loop()
            finally:
                self.notifier.stopping()
                for task in (monitor, watchdog):
                    if task is not None:
                        task.cancel()
                await self._stop_all("daemon stopping")
                await self.proxy.stop()
                await self.api.stop()
                await self.records.close()
                self.systemd.close()
                await self._http.close()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)
                self.emit("daemon", "specfleet stopped")
        return 0

    async def _main_loop(self) -> None:
        while True:
            try:
                sig = await asyncio.wait_for(self._signals.get(), timeout=STATUS_REFRESH)
            except TimeoutError:
                self.write_status()
                continue
            if sig == signal.SIGHUP:
                await self.reload()
            else:
                self.emit("daemon", f"received {signal.Signals(sig).name}: stopping every target")
                return

    @contextlib.contextmanager
    def _single_instance(self):  # type: ignore[no-untyped-def]
        lock_path = self.state_dir / "daemon.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpecfleetError(f"another specfleet daemon (pid {holder}) is using state_dir "
                                 f"{self.state_dir}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.close(fd)

    # --- targets ---

    def _launcher_for(self, target: Target) -> Launcher:
        return {"systemd": self.systemd, "external": self.external}.get(target.launcher,
                                                                        self.launcher)

    def _uses_systemd(self, fleet: Fleet) -> bool:
        """Targets on systemd, or target units left from an earlier fleet file (which must be
        stopped, or a target moved back to the process launcher would meet its own port)."""
        return any(t.launcher == "systemd" for t in fleet.targets.values()) or any(
            self.systemd.unit_dir.glob(f"{units.UNIT_PREFIX}*.service"))

    async def _remove_leftover_units(self, fleet: Fleet) -> None:
        keep = {n for n, t in fleet.targets.items() if t.launcher == "systemd"}
        for unit in await self.systemd.remove_leftovers(keep):
            self.emit("daemon", f"stopped and removed {unit}: its target is no longer in the "
                      "fleet file (or no longer uses launcher: systemd)")

    def _add(self, target: Target) -> None:
        assert self._http is not None
        launcher = self._launcher_for(target)
        sup = TargetSupervisor(target, self.registry.backend_for(target), launcher,
                               self.events, self._http,
                               log_file=str(launcher.log_path(target.name)),
                               tuning_store=self.tuning_store, placer=self.placer,
                               records=self.records, launcher_name=target.launcher)
        self.supervisors[target.name] = sup
        sup.launch().add_done_callback(self._owner_ended)

    def _owner_ended(self, task: asyncio.Task[None]) -> None:
        # An owner task only ends by shutdown; anything else is a bug that must be loud.
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.log.error("internal error: a target's supervisor stopped; its process was "
                           "killed", task=task.get_name(), exc_info=exc)
            self.emit("error", f"{task.get_name()} stopped by an internal error: {exc!r}")

    async def _stop_all(self, reason: str) -> None:
        # Reverse file order: what was listed first (often what others depend on) stops last.
        for sup in reversed(list(self.supervisors.values())):
            if sup.launcher.detaches and not self.fleet.daemon.stop_targets_on_exit:
                await sup.detach(f"{reason}; stop_targets_on_exit is false")
            else:
                await sup.shutdown(reason)

    async def reload(self) -> bool:
        """Apply a changed fleet file; a bad file changes nothing."""
        return (await self.reload_with_problems())[0]

    async def reload_with_problems(self) -> tuple[bool, list[str]]:
        async with self._reload_lock:  # SIGHUP and the API may ask at the same time
            return await self._reload()

    async def _reload(self) -> tuple[bool, list[str]]:
        try:
            loaded = await asyncio.to_thread(load_fleet, self.fleet_path,
                                             self.registry.check_target)
        except FleetFileError as exc:
            for problem in exc.problems:
                self.log.error("reload rejected", problem=problem)
            self.emit("reload", f"reload rejected: {len(exc.problems)} problem(s) in "
                      f"{self.fleet_path}; the running fleet is unchanged",
                      detail="\n".join(exc.problems))
            return False, list(exc.problems)
        new = loaded.fleet
        if new.daemon != self.fleet.daemon:
            self.log.warning("daemon: settings changed; they take effect when the daemon restarts")
        old_targets, new_targets = self.fleet.targets, new.targets
        removed = [n for n in old_targets if n not in new_targets]
        added = [n for n in new_targets if n not in old_targets]
        changed = [n for n in new_targets if n in old_targets and new_targets[n] != old_targets[n]]
        self.emit("reload", f"reloaded {self.fleet_path}: {len(added)} added, {len(removed)} "
                  f"removed, {len(changed)} changed",
                  data={"added": added, "removed": removed, "changed": changed})
        self.fleet = new
        if self._uses_systemd(new) or self._uses_systemd(self.fleet):
            await self.systemd.connect()
        # Plan the new fleet against free memory plus what its own running targets hold.
        await self._plan(new, held_vram(s.resources for s in self.supervisors.values()))
        for name in removed:
            await self.supervisors.pop(name).shutdown("removed from the fleet file")
        for name in changed:
            await self.supervisors.pop(name).shutdown("changed in the fleet file")
            self._add(new_targets[name])
        for name in added:
            self._add(new_targets[name])
        if self.systemd.connected:
            await self._remove_leftover_units(new)
        # Keep file order for status and for the stop order.
        self.supervisors = {n: self.supervisors[n] for n in new_targets if n in self.supervisors}
        return True, []

    # --- the HTTP side ---

    async def _listen(self) -> None:
        settings = self.fleet.daemon
        if settings.api_token is not None and not settings.api_token.read("daemon.api_token"):
            raise SpecfleetError("daemon.api_token is empty: set the token (the API and the "
                                 "proxy would refuse every request)")
        try:
            await self.api.start(settings.api)
            if settings.proxy.enabled:
                await self.proxy.start(settings.proxy.listen)
        except OSError as exc:
            raise SpecfleetError(f"cannot listen: {exc.strerror or exc} (daemon.api "
                                 f"{settings.api}, daemon.proxy.listen {settings.proxy.listen})"
                                 ) from exc
        self.emit("daemon", f"API on http://{settings.api}" + (
            f", OpenAI-compatible proxy on http://{settings.proxy.listen}/v1"
            if settings.proxy.enabled else ""))

    def api_token(self) -> str | None:
        """The API token, read from its source each time (a rotated file takes effect)."""
        return read_api_token(self.fleet)

    def daemon_info(self) -> dict[str, Any]:
        return {"status": "ok", "pid": os.getpid(), "create_time": self._create_time,
                "version": __version__, "fleet_file": str(self.fleet_path),
                "started": self._started, "updated": time.time(),
                "state_dir": str(self.state_dir), "gpus": self.monitor.snapshot.to_dict(),
                "api": self.fleet.daemon.api,
                "proxy": self.fleet.daemon.proxy.listen if self.fleet.daemon.proxy.enabled
                else None}

    def target_statuses(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        return [asdict(s.status()) for n, s in self.supervisors.items()
                if names is None or n in names]

    # --- VRAM plan and resources ---

    async def _plan(self, fleet: Fleet, ours: dict[int, int] | None = None) -> None:
        backends = {n: self.registry.backend_for(t) for n, t in fleet.targets.items()}
        fp = await self.placer.replan(backends, ours)
        if fp.unavailable:
            self.emit("gpu", fp.unavailable)
        elif fp.plan is not None:
            placed = {n: list(a.gpus) for n, a in fp.plan.assignments.items()}
            self.emit("gpu", f"VRAM plan ({fp.source}): {len(placed)} target(s) placed, "
                      f"{len(fp.plan.refused)} refused", data={"placed": placed,
                                                                "refused": fp.plan.refused})
        if fp.host_warning:
            self.log.warning(fp.host_warning)

    def _running_pids(self) -> dict[str, int]:
        out = {}
        for name, sup in self.supervisors.items():
            if sup.process is not None and sup.process.returncode is None and sup.process.pid > 0:
                out[name] = sup.process.pid
            else:
                sup.resources = {}
        return out

    def _publish_usage(self, name: str, usage: dict[str, Any]) -> None:
        if (sup := self.supervisors.get(name)) is not None:
            sup.resources = usage

    def _headroom_alert(self, alert: HeadroomAlert) -> None:
        self.emit("gpu", alert.message, data={"gpu": alert.gpu, "low": alert.low})

    # --- systemd: watchdog and status line ---

    async def _watchdog(self) -> None:
        """WATCHDOG=1 from the event loop itself: a blocked loop stops the pings, and systemd
        restarts the daemon after WatchdogSec."""
        fault = os.environ.get("SPECFLEET_FAULT_BLOCK_LOOP_ON_SIGUSR2")
        if fault:  # fault injection for the watchdog test (docs/systemd.md)
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGUSR2, time.sleep, float(fault))
        if self.notifier.watchdog_interval is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(self.notifier.watchdog_interval / 2)

    def summary(self) -> str:
        """One line for systemd's STATUS= (shown by `systemctl status specfleet`)."""
        counts: dict[str, int] = {}
        for sup in self.supervisors.values():
            counts[sup.state.value] = counts.get(sup.state.value, 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        return f"{len(self.supervisors)} targets" + (f": {states}" if states else "")

    # --- events and status ---

    def emit(self, kind: str, reason: str, detail: str | None = None,
             data: dict[str, Any] | None = None) -> None:
        self.events.emit(Event("-", kind, reason, detail=detail, data=data or {}))

    def _log_event(self, event: Event) -> None:
        if event.kind == "state":
            level = "error" if event.new == "failed" else (
                "warning" if event.new in ("backoff", "degraded") else "info")
            getattr(self.log, level)(f"{event.old} -> {event.new}", target=event.target,
                                     reason=event.reason, **event.data)
            if event.detail and event.new in ("backoff", "failed"):
                self.log.warning("runtime output (last lines)", target=event.target,
                                 output=event.detail)
        else:
            data = {k: v for k, v in event.data.items() if k not in ("evidence", "window")}
            self.log.info(event.reason, kind=event.kind, target=event.target, **data)

    def write_status(self) -> None:
        statusfile.write(self.state_dir, self.daemon_info(),
                         [s.status() for s in self.supervisors.values()])
        if self._ready_sent:
            self.notifier.status(self.summary())
