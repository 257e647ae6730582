"""The systemd launcher: each target is the unit `specfleet-<name>.service`.

specfleet writes the unit file (launcher/systemd/unitfile.py) into the unit directory,
reloads the manager when the file changed, and controls the unit over D-Bus: StartUnit
and StopUnit jobs awaited through JobRemoved, the unit's exit seen through
PropertiesChanged, KillUnit for a hung runtime. Units outlive the daemon: a daemon that
starts again adopts a unit that still runs the command it would start, instead of
starting a second server on the same port. The runtime's output is in the journal
(`journalctl -u specfleet-<name>`); the tail of the last invocation is read from there
when the unit ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.atomicfile import write_text
from supervisor.config.daemonsettings import SystemdSettings
from supervisor.config.schema import Fleet
from supervisor.errors import SpecfleetError, StartRefused
from supervisor.launcher.running import TargetProcess
from supervisor.launcher.systemd import unitfile
from supervisor.launcher.systemd.manager import SERVICE, UNIT, SystemdError, SystemdManager
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import Launcher, LauncherContext, LauncherTraits

if TYPE_CHECKING:
    from supervisor.plugin.values import LaunchSpec

_ACTIVE = ("active", "activating", "reloading", "deactivating")
_CLD_EXITED = 1
_TAIL = 200


def default_unit_dir(user: bool) -> Path:
    if user:
        base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        return Path(base) / "systemd" / "user"
    return Path("/etc/systemd/system")


class SystemdUnit(TargetProcess):
    """A running target unit, as a RunningProcess (its output is in the journal)."""

    def __init__(self, launcher: SystemdLauncher, unit: str, path: str, pid: int,
                 invocation: str) -> None:
        super().__init__(pid, None)
        self._launcher = launcher
        self.unit = unit
        self._path = path
        self.invocation = invocation
        self._result = ""
        self._tail = ""
        self._exit = asyncio.get_running_loop().create_future()
        self._finishing: asyncio.Task[None] | None = None
        self._unwatch = launcher.manager.watch(path, self._changed)

    def _changed(self, props: dict[str, Any]) -> None:
        if props.get("ActiveState") in ("inactive", "failed") and self._finishing is None:
            self._finishing = asyncio.create_task(self._finish(), name=f"exit:{self.unit}")

    async def check_alive(self) -> None:
        """After watching starts: the unit may have ended before (a signal we missed)."""
        state = (await self._launcher.manager.properties(self._path, UNIT))["ActiveState"]
        self._changed({"ActiveState": state})

    async def _finish(self) -> None:
        manager = self._launcher.manager
        try:
            svc = await manager.properties(self._path, SERVICE)
            code, status = int(svc.get("ExecMainCode", 0)), int(svc.get("ExecMainStatus", 0))
            self._result = str(svc.get("Result", ""))
            self._returncode = status if code == _CLD_EXITED else -status if code else -1
        except SystemdError:
            self._returncode = -1
        self._tail = await self._launcher.journal_tail(self.invocation)
        self._unwatch()
        assert self._exit is not None
        if not self._exit.done():
            self._exit.set_result(self._returncode)

    async def stop(self, grace: float) -> int:
        # systemd does SIGTERM, TimeoutStopSec (the target's stop_grace), SIGKILL, to the
        # whole control group.
        if self._returncode is None:
            with contextlib.suppress(SystemdError):
                await self._launcher.manager.run_job("StopUnit", self.unit)
            await self.check_alive()
        return await self.wait()

    def kill(self) -> None:
        self._background(self._launcher.manager.kill(self.unit, "all", signal.SIGKILL),
                         f"kill:{self.unit}")

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(self._tail.splitlines()[-lines:])

    def oom_killed(self) -> bool:
        return self._result == "oom-kill"


class SystemdLauncher(Launcher):
    name = "systemd"
    traits = LauncherTraits(detaches=True)  # units keep running when the daemon exits

    def __init__(self, settings: SystemdSettings, state_dir: Path) -> None:
        self.settings = settings
        self.user = settings.scope == "user"
        self.unit_dir = Path(settings.unit_dir).expanduser() if settings.unit_dir \
            else default_unit_dir(self.user)
        self.env_dir = state_dir / "units-env"
        self.state_dir = state_dir
        self._manager: SystemdManager | None = None
        self._files_lock = asyncio.Lock()  # one writer of unit files and daemon-reloads

    @classmethod
    def from_context(cls, context: LauncherContext) -> SystemdLauncher:
        return cls(context.settings.systemd, context.state_dir)

    @property
    def connected(self) -> bool:
        return self._manager is not None

    @property
    def manager(self) -> SystemdManager:
        assert self._manager is not None, "connect() first"
        return self._manager

    async def connect(self) -> None:
        if self._manager is None:
            self._manager = await SystemdManager.connect(self.user)

    def disconnect(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    async def close(self) -> None:
        self.disconnect()

    async def prepare(self, fleet: Fleet) -> None:
        """Connect when the fleet has targets on systemd, or target units are left from an
        earlier fleet file (which must be stopped, or a target moved back to the process
        launcher would meet its own port)."""
        if self.own_targets(fleet) or any(self.unit_dir.glob(f"{unitfile.UNIT_PREFIX}*.service")):
            await self.connect()

    def log_path(self, name: str) -> str:
        return f"journalctl {'--user ' if self.user else ''}-u {unitfile.unit_name(name)}"

    # --- unit files ---

    def render(self, name: str, spec: LaunchSpec, stop_grace: float) -> tuple[str, str | None]:
        """(unit text, secrets file text or None) for a target."""
        env_file = str(self.env_dir / f"{name}.env") if spec.secret_env else None
        text = unitfile.render_target(name, spec, description=spec.argv[0].rsplit("/", 1)[-1],
                                   stop_grace=stop_grace, working_directory=str(self.state_dir),
                                   env_file=env_file, state_dir=str(self.state_dir))
        return text, unitfile.render_env_file(spec) if spec.secret_env else None

    async def _install(self, name: str, spec: LaunchSpec, stop_grace: float) -> None:
        text, secrets = self.render(name, spec, stop_grace)
        async with self._files_lock:
            changed = _write_if_changed(self.unit_dir / unitfile.unit_name(name), text, 0o644)
            if secrets is not None:
                self.env_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                _write_if_changed(self.env_dir / f"{name}.env", secrets, 0o600)
            if changed:
                await self.manager.reload()

    def _matches(self, name: str, spec: LaunchSpec, stop_grace: float) -> bool:
        text, secrets = self.render(name, spec, stop_grace)
        try:
            if (self.unit_dir / unitfile.unit_name(name)).read_text() != text:
                return False
            return secrets is None or (self.env_dir / f"{name}.env").read_text() == secrets
        except OSError:
            return False

    # --- units of another daemon (another state dir) on the same manager ---

    def _foreign_owner(self, name: str) -> str | None:
        """The state dir of another daemon whose unit the target's would be; None when the
        unit is ours, absent, or written before units named their daemon."""
        try:
            text = (self.unit_dir / unitfile.unit_name(name)).read_text()
        except OSError:
            return None
        owner = unitfile.owner_of(text)
        if owner is None or os.path.realpath(owner) == os.path.realpath(self.state_dir):
            return None
        return owner

    async def _refuse_foreign(self, name: str) -> None:
        """StartRefused while the unit belongs to another daemon that runs it or is alive;
        one whose daemon is gone (its lock free) and whose unit is stopped is taken over."""
        if (owner := self._foreign_owner(name)) is None:
            return
        unit = unitfile.unit_name(name)
        states = {n: state for n, state, _ in await self.manager.list_units([unit])}
        running = states.get(unit) in _ACTIVE
        if running or _lock_held(Path(owner) / "daemon.lock"):
            raise StartRefused(
                f"{unit} belongs to the specfleet daemon whose state dir is {owner} (the unit "
                f"{'runs' if running else 'is stopped, and that daemon runs'}): two daemons on "
                f"one systemd manager cannot both have a target {name!r}; rename one of them")

    # --- the Launcher interface ---

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> SystemdUnit:
        """`on_line` is not fed: the output goes to the journal, not through specfleet."""
        await self.connect()
        await self._refuse_foreign(name)
        unit = unitfile.unit_name(name)
        spec.write_files()
        await self._install(name, spec, stop_grace)
        await self.manager.reset_failed(unit)
        result = await self.manager.run_job("StartUnit", unit)
        if result != "done":
            tail = await self.journal_tail(None, unit)
            raise SpecfleetError(f"systemd could not start {unit} (job {result})"
                                 + (f":\n{tail}" if tail else ""))
        return await self._attach(unit)

    async def _attach(self, unit: str) -> SystemdUnit:
        path = await self.manager.unit_path(unit)
        svc = await self.manager.properties(path, SERVICE)
        unit_props = await self.manager.properties(path, UNIT)
        invocation = bytes(unit_props.get("InvocationID") or b"").hex()
        proc = SystemdUnit(self, unit, path, int(svc.get("MainPID", 0)), invocation)
        await proc.check_alive()
        return proc

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[SystemdUnit | None, str]:
        """The target's unit if it still runs the command specfleet would start now."""
        await self.connect()
        await self._refuse_foreign(name)
        unit = unitfile.unit_name(name)
        states = {n: state for n, state, _ in await self.manager.list_units([unit])}
        if states.get(unit) not in _ACTIVE:
            return None, ""
        if not self._matches(name, spec, stop_grace):
            await self.manager.run_job("StopUnit", unit)
            return None, (f"{unit} was running another command (the fleet file or a tuning "
                          "decision changed while specfleet was down): restarted with this one")
        proc = await self._attach(unit)
        return proc, f"adopted {unit}, still running (pid {proc.pid})"

    async def discard(self, name: str) -> str:
        """The target's unit still active although the target starts unloaded (the daemon
        before was killed): stopped, or it would hold its port and memory unseen."""
        try:
            await self.connect()
            unit = unitfile.unit_name(name)
            states = {n: state for n, state, _ in await self.manager.list_units([unit])}
            if states.get(unit) not in _ACTIVE or self._foreign_owner(name) is not None:
                return ""
            await self.manager.run_job("StopUnit", unit)
        except (SpecfleetError, OSError) as exc:  # the manager's errors, its socket's
            return f"could not look for a unit left running by an earlier daemon: {exc}"
        return (f"stopped {unit}, left running by an earlier daemon that did not stop: the "
                "target swaps, so it starts unloaded")

    async def remove_leftovers(self, fleet: Fleet) -> list[str]:
        if not self.connected:
            return []  # prepare() found neither targets nor units of ours
        return [f"stopped and removed {unit}: its target is no longer in the fleet file (or "
                "no longer uses launcher: systemd)"
                for unit in await self._remove_units(self.own_targets(fleet))]

    async def _remove_units(self, keep: set[str]) -> list[str]:
        """Stop and delete target units whose target is not in `keep`."""
        names = {n for n, _, _ in await self.manager.list_units([f"{unitfile.UNIT_PREFIX}*.service"])}
        names |= {p.name for p in self.unit_dir.glob(f"{unitfile.UNIT_PREFIX}*.service")}
        removed = []
        for unit in sorted(names):
            target = unitfile.target_of(unit)
            if target is None or target in keep or self._foreign_owner(target) is not None:
                continue  # not a target unit, still wanted, or another daemon's
            with contextlib.suppress(SystemdError):
                await self.manager.run_job("StopUnit", unit)
            for path in (self.unit_dir / unit, self.env_dir / f"{target}.env"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            removed.append(unit)
        if removed:
            await self.manager.reload()
        return removed

    async def journal_tail(self, invocation: str | None, unit: str | None = None) -> str:
        """The last lines a unit invocation wrote, from the journal (which may lag a little
        behind the unit's exit: retried briefly)."""
        match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else ["-u", unit or ""]
        for _ in range(10):
            proc = await asyncio.create_subprocess_exec(
                "journalctl", *(["--user"] if self.user else []), *match, "-o", "cat",
                "-n", str(_TAIL), "--no-pager", stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL)
            out, _ = await proc.communicate()
            text = out.decode(errors="replace").strip()
            if text and text != "-- No entries --":
                return text
            await asyncio.sleep(0.1)
        return ""

    # Units are not orphans to sweep: they are adopted, or removed by remove_leftovers.


def _lock_held(path: Path) -> bool:
    """Whether a daemon holds the lock of its state dir (lifecycle.py's flock): alive."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def _write_if_changed(path: Path, text: str, mode: int) -> bool:
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    write_text(path, text, mode)
    return True


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(SystemdLauncher)
