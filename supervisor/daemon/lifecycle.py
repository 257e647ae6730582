"""The daemon's lifecycle: start, signals, the single-instance lock, the HTTP listeners,
the status file, sd_notify and the watchdog. The targets themselves live in
daemon/fleet.py.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from supervisor import __version__
from supervisor.api import listening
from supervisor.api.proxy import Proxy
from supervisor.api.server import ApiServer
from supervisor.config.loader import LoadedFleet
from supervisor.config.schema import Fleet, Target
from supervisor.daemon import memtrim, statusfile
from supervisor.daemon.fleet import FleetSupervisors
from supervisor.daemon.fleetapi import FleetApi
from supervisor.daemon.logs import get_logger
from supervisor.daemon.notify import Notifier
from supervisor.daemon.statedir import StateDirHealth
from supervisor.errors import SpecfleetError
from supervisor.events import Event, EventBus, EventLog
from supervisor.gpu.monitor import HeadroomAlert, ResourceMonitor
from supervisor.gpu.placement import Placer
from supervisor.launcher import processstamp
from supervisor.launcher.installed import InstalledLaunchers
from supervisor.plugin.registry import Registry
from supervisor.supervision.probes import sleep_to_next_tick

STATUS_REFRESH = 5.0  # seconds between status-file rewrites when nothing happens
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: a reload


class Daemon:
    def __init__(self, fleet_path: Path, loaded: LoadedFleet, registry: Registry) -> None:
        self.fleet_path = fleet_path
        self.events = EventBus()
        self.log = get_logger()
        settings = loaded.fleet.daemon
        self.settings = settings  # daemon settings take effect at the next daemon start
        self.state_dir = Path(settings.state_dir).expanduser()
        # Every writer of the state dir reports here instead of raising (a full disk).
        self.state_health = StateDirHealth(self.state_dir, self.emit)
        self.launchers = InstalledLaunchers(registry, settings, self._target_named,
                                            self._target_event, self.state_health)
        self.notifier = Notifier()
        self._ready_sent = False
        self.targets = FleetSupervisors(fleet_path, loaded.fleet, registry, self.events,
                                        self.launchers.for_target, Placer(settings.gpu),
                                        self.state_dir, self.emit, self.daemon_info,
                                        self.state_health, before_apply=self._before_reload,
                                        after_apply=self._after_reload,
                                        on_owner_error=self._owner_ended)
        view = FleetApi(self.targets)  # what the HTTP side reads
        self.api = ApiServer(view)
        self.proxy = Proxy(view, settings.proxy.hold)
        self.monitor = ResourceMonitor(settings.gpu, self.targets.running_pids,
                                       self.targets.publish_usage, self._headroom_alert)
        self._signals: asyncio.Queue[int] = asyncio.Queue()
        self._stop_asked = False  # SIGTERM or SIGINT came (the main loop acts on it)
        self._background: list[asyncio.Task[None]] = []  # monitor, watchdog
        self._started = time.time()
        self._stamp = processstamp.stamp(os.getpid())
        self.events.subscribe(self._log_event)

    @property
    def fleet(self) -> Fleet:
        return self.targets.fleet

    # --- lifecycle ---

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.state_health.on_loop(loop)
        # First of all: a SIGTERM from here on is the daemon's to handle, whatever it is
        # doing (sweeping orphans, connecting to Ray, starting targets): a stop that came
        # before the targets start skips them (_serve), and the daemon exits 0.
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._signalled, sig)
        try:
            return await self._run()
        finally:
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def _signalled(self, sig: int) -> None:
        self._stop_asked = self._stop_asked or sig != signal.SIGHUP
        self._signals.put_nowait(sig)

    async def _run(self) -> int:
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecfleetError(f"cannot create state_dir {self.state_dir}: "
                                 f"{exc.strerror or exc}") from None
        with (self._single_instance(),
              EventLog(self.state_dir / "events.jsonl", self.state_health) as event_log):
            self.events.subscribe(event_log.append)
            # After the journal: whoever reads a state in status.json finds the event that
            # led to it already in events.jsonl (never `failed` without its event).
            self.events.subscribe(lambda _: self.write_status())
            if killed := self.launchers.sweep_orphans():
                self.log.warning("killed processes left by a daemon that died uncleanly",
                                 processes=killed)
            await self.launchers.prepare(self.fleet)
            await self._remove_leftovers(self.fleet)
            # Connection: close on every probe: an idle keep-alive connection would tie up
            # one of llama-server's few HTTP worker threads.
            self.targets.connect(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True)))
            try:
                await self._serve()
            finally:
                await self._close()
                self.emit("daemon", "specfleet stopped")
        return 0

    async def _serve(self) -> None:
        self.emit("daemon", f"specfleet {__version__} started with {self.fleet_path} "
                  f"({len(self.fleet.targets)} targets)")
        await self.targets.plan(self.fleet)
        await self._listen()
        self._background = [asyncio.create_task(self.monitor.run(), name="monitor"),
                            asyncio.create_task(self._watchdog(), name="watchdog"),
                            asyncio.create_task(self.targets.on_demand.run(), name="idle"),
                            asyncio.create_task(self._sample_history(), name="history"),
                            asyncio.create_task(self._trim_memory(), name="malloc_trim")]
        await self.targets.discard_left_running()
        for target in self.fleet.targets.values() if not self._stop_asked else ():
            self.targets.add(target)  # (not when asked to stop meanwhile: nothing to undo)
        self.proxy.fleet_added()
        # The first reconcile is done: every target is started, adopted or refused.
        # Models may still be loading; READY=1 does not wait for them (minutes).
        await asyncio.sleep(0)
        self._ready_sent = self.notifier.ready(self.summary())
        await self._main_loop()

    async def _close(self) -> None:
        self.notifier.stopping()
        # Requests under way through the proxy finish before their targets stop (a kill -9
        # cuts them: the proxy lives in the daemon). The watchdog still runs meanwhile.
        drain = self.settings.proxy.drain
        under_way, left = await self.proxy.drain(drain)
        if under_way:
            self.emit("daemon", f"stopping: {under_way - left} proxy request(s) under way "
                      "finished" + (f", {left} cut after {drain:g}s (daemon.proxy.drain)"
                                    if left else ""))
        for task in self._background:
            task.cancel()
        await self.targets.stop_all("daemon stopping")
        await self.proxy.stop()
        await self.api.stop()
        await self.targets.records.close()
        await self.launchers.close()
        if self.targets.http is not None:
            await self.targets.http.close()

    async def _sample_history(self) -> None:
        # Once a second: each target's counters are read at its own metrics_interval.
        while True:
            await sleep_to_next_tick(1.0)
            self.targets.sample_history(time.time())

    async def _trim_memory(self) -> None:
        # Freed C heap pages back to the system (memtrim.py: the soak's RSS growth).
        trim = memtrim.trimmer()
        while trim is not None:
            await asyncio.sleep(memtrim.PERIOD_S)
            trim()

    async def _main_loop(self) -> None:
        while True:
            try:
                sig = await asyncio.wait_for(self._signals.get(), timeout=STATUS_REFRESH)
            except TimeoutError:
                self.write_status()
                continue
            if sig == signal.SIGHUP:
                await self.targets.reload()
            else:
                self.emit("daemon", f"received {signal.Signals(sig).name}: stopping every target")
                return

    @contextlib.contextmanager
    def _single_instance(self) -> Iterator[None]:
        lock_path = self.state_dir / "daemon.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpecfleetError(f"cannot create the lock file {lock_path}: "
                                 f"{exc.strerror or exc} (state_dir must be writable)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpecfleetError(f"another specfleet daemon (pid {holder}) is using state_dir "
                                 f"{self.state_dir}") from None
        try:  # the pid in the lock file is also the check that the state dir takes writes
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise SpecfleetError(f"cannot write the lock file {lock_path}: "
                                 f"{exc.strerror or exc} (state_dir must be writable)") from None
        try:
            yield
        finally:
            os.close(fd)

    def _owner_ended(self, task: asyncio.Task[None]) -> None:
        # An owner task only ends by shutdown; anything else is a bug that must be loud.
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.log.error("internal error: a target's supervisor stopped; its process was "
                           "killed", task=task.get_name(), exc_info=exc)
            self.emit("error", f"{task.get_name()} stopped by an internal error: {exc!r}")

    # --- launchers ---

    def _target_named(self, name: str) -> Target:
        """The definition a target's supervisor runs (during a reload, the fleet's may be
        the next one already)."""
        sup = self.targets.supervisors.get(name)
        return sup.target if sup is not None else self.fleet.targets[name]

    def _target_event(self, target: str, reason: str) -> None:
        self.events.emit(Event(target, "placement", reason))

    async def _remove_leftovers(self, fleet: Fleet) -> None:
        for said in await self.launchers.remove_leftovers(fleet):
            self.emit("daemon", said)

    async def _before_reload(self, old: Fleet, new: Fleet) -> None:
        if new.daemon != old.daemon:
            self.log.warning("daemon: settings changed; they take effect when the daemon restarts")
        await self.launchers.prepare(old)
        await self.launchers.prepare(new)

    async def _after_reload(self, new: Fleet) -> None:
        await self._remove_leftovers(new)

    # --- the HTTP side ---

    async def _listen(self) -> None:
        settings = self.settings
        if settings.api_token is not None and not settings.api_token.read("daemon.api_token"):
            raise SpecfleetError("daemon.api_token is empty: set the token (the API and the "
                                 "proxy would refuse every request)")
        handed = listening.inherited()  # under specfleet.socket: systemd's sockets
        count = len(handed)
        self.proxy.expect_fleet()
        try:
            await self.api.start(settings.api, listening.take(handed, settings.api))
            if settings.proxy.enabled:
                await self.proxy.start(settings.proxy.listen,
                                       listening.take(handed, settings.proxy.listen))
        except OSError as exc:
            raise SpecfleetError(f"cannot listen: {exc.strerror or exc} (daemon.api "
                                 f"{settings.api}, daemon.proxy.listen {settings.proxy.listen})"
                                 ) from exc
        for sock in handed:
            self.log.warning("a socket from systemd matches neither daemon.api nor "
                             "daemon.proxy.listen: closed", address=str(sock.getsockname()))
            sock.close()
        self.emit("daemon", f"API on http://{settings.api}" + (
            f", OpenAI-compatible proxy on http://{settings.proxy.listen}/v1"
            if settings.proxy.enabled else "") + (" (sockets from systemd)" if count else ""))

    def daemon_info(self) -> dict[str, Any]:
        settings = self.settings
        return {"status": self.state_health.problem or "ok",
                **self._stamp,
                "version": __version__, "fleet_file": str(self.fleet_path),
                "started": self._started, "updated": time.time(),
                "state_dir": str(self.state_dir), "gpus": self.monitor.snapshot.to_dict(),
                "api": settings.api,
                "proxy": settings.proxy.listen if settings.proxy.enabled else None}

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
        for sup in self.targets.supervisors.values():
            counts[sup.state.value] = counts.get(sup.state.value, 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        return f"{len(self.targets.supervisors)} targets" + (f": {states}" if states else "")

    # --- events and status ---

    def emit(self, kind: str, reason: str, detail: str | None = None,
             data: dict[str, Any] | None = None) -> None:
        self.events.emit(Event("-", kind, reason, detail=detail, data=data or {}))

    def _log_event(self, event: Event) -> None:
        if event.kind == "state":
            level = "error" if event.new == "failed" else (
                "warning" if event.new in ("backoff", "degraded", "waiting") else "info")
            getattr(self.log, level)(f"{event.old} -> {event.new}", target=event.target,
                                     reason=event.reason, **event.data)
            if event.detail and event.new in ("backoff", "failed", "waiting"):
                self.log.warning("runtime output (last lines)", target=event.target,
                                 output=event.detail)
        elif event.kind == "reload" and event.detail:
            for problem in event.detail.splitlines():
                self.log.error("reload rejected", problem=problem)
        else:
            # Events that need a human (a full state dir, a pairing warning) say so in data.
            level = event.data.get("level") if event.data.get("level") in (
                "warning", "error") else "info"
            data = {k: v for k, v in event.data.items()
                    if k not in ("evidence", "window", "level")}
            getattr(self.log, level)(event.reason, kind=event.kind, target=event.target, **data)

    def write_status(self) -> None:
        """Rewrite status.json, and retry what could not be written before (a full disk)."""
        self.state_health.attempt(statusfile.STATUS_FILE, lambda: statusfile.write(
            self.state_dir, self.targets.daemon_info(),
            [s.status() for s in self.targets.supervisors.values()]))
        self.state_health.retry()
        if self._ready_sent:
            self.notifier.status(self.summary())
