"""The embedded default launcher: each target is a child process in its own process group.

No orphans, by three layers:
1. stop() signals the whole process group (SIGTERM or the spec's stop signal, grace,
   SIGKILL), so helpers
   a runtime forks go with it;
2. every child gets PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it when the
   daemon dies by any means, SIGKILL included;
3. the pids of running children are recorded in the state directory (children.py); a daemon
   that starts after an unclean death kills any recorded process group that is
   still alive (same pid and start time, so a recycled pid is never hit).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.gpu import oom
from supervisor.launcher.children import ChildRegistry
from supervisor.launcher.outputlog import OutputLog, pump
from supervisor.launcher.running import TargetProcess
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import Launcher, LauncherContext, LauncherTraits

if TYPE_CHECKING:
    from supervisor.plugin.values import LaunchSpec

PR_SET_PDEATHSIG = 1


# The signals a server may be stopped by (LaunchSpec.stop_signal).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
                signal.SIGUSR2)


def default_stop_signals(libc: ctypes.CDLL) -> None:
    """Between fork and exec: the stop signals back to their defaults and unblocked. An
    ignored signal passes through exec, and a shell cannot even trap one it started with
    ignored: a daemon run as `specfleet run ... &` from a script has SIGINT and SIGQUIT
    ignored, under `nohup` SIGHUP, and its servers would not stop on them. (libc's
    signal(): Python's refuses outside the main thread.)"""
    for sig in STOP_SIGNALS:
        libc.signal(int(sig), 0)  # SIG_DFL
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    default_stop_signals(libc)
    # The parent may have died before prctl took effect: then nobody would kill us.
    if os.getppid() != parent_pid:
        os._exit(1)


# The lowest CPU priority: a background server (the tuner's calibration) takes only the
# cycles the serving servers leave.
BACKGROUND_NICE = 19


def give_way(pid: int) -> None:
    """Lower `pid`'s session below every other on the CPU. With autogroup scheduling (the
    Linux default on desktops and most servers) a nice value ranks threads only within
    their session, and each child here has its own (start_new_session): the session's
    autogroup gets the nice too, else a niced server still gets half the cores beside a
    serving one (measured: benchmarks/calibration_beside.py). Best effort: a kernel without
    autogroup has no such file."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{BACKGROUND_NICE}\n")


class ChildProcess(TargetProcess):
    def __init__(self, proc: asyncio.subprocess.Process, log: OutputLog,
                 registry: ChildRegistry, name: str,
                 on_line: Callable[[str], None] | None = None,
                 stop_signal: int = signal.SIGTERM) -> None:
        super().__init__(proc.pid, log)
        self._proc = proc
        self._stop_signal = stop_signal
        self._on_line = on_line
        self._registry = registry
        self._name = name
        self._killed_by_us = False
        # The kernel OOM killer leaves no message: compare the cgroup's oom_kill counter.
        self._cgroup = oom.cgroup_of(proc.pid)
        self._oom_kills = oom.oom_kills(self._cgroup)
        self._reader = asyncio.create_task(self._pump(), name=f"output:{name}")
        self._exit = asyncio.create_task(self._reap(), name=f"reap:{name}")

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode  # known as soon as the child is reaped

    async def _pump(self) -> None:
        assert self._proc.stdout is not None
        await pump(self._proc.stdout, self._log, self._on_line)

    async def _reap(self) -> int:
        code = await self._proc.wait()
        # The group may outlive its leader (a forked helper): it must not.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=5)
        if not self._reader.done():
            self._reader.cancel()
        self._registry.remove(self._name, self.pid)
        return self._ended(code, f"pid {self.pid} exited with status {code}")

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        self._killed_by_us = True
        self._signal_group(signal.SIGKILL)

    def oom_killed(self) -> bool:
        if self._proc.returncode != -signal.SIGKILL or self._killed_by_us:
            return False
        after = oom.oom_kills(self._cgroup)
        return after is not None and self._oom_kills is not None and after > self._oom_kills

    async def stop(self, grace: float) -> int:
        if self._proc.returncode is None:
            self._signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self._signal_group(self._stop_signal)
            try:
                return await asyncio.wait_for(self.wait(), timeout=grace)
            except TimeoutError:
                self.kill()
        return await self.wait()


class ProcessLauncher(Launcher):
    name = "process"
    # Children die with the daemon (PR_SET_PDEATHSIG); two of one target may run at once.
    traits = LauncherTraits(beside=True)

    def __init__(self, log_dir: Path, state_dir: Path, max_bytes: int = 10 * 1024 * 1024,
                 backups: int = 3, children: ChildRegistry | None = None) -> None:
        self.log_dir = log_dir
        self.max_bytes = max_bytes
        self.backups = backups
        self.children = children or ChildRegistry(state_dir / "children.json")

    @classmethod
    def from_context(cls, context: LauncherContext) -> ProcessLauncher:
        settings = context.settings
        children = context.children if isinstance(context.children, ChildRegistry) else None
        return cls(context.log_dir, context.state_dir, settings.log_max_bytes,
                   settings.log_backups, children)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None,
                    background: bool = False) -> ChildProcess:
        """`background`: at the lowest CPU priority (give_way), for a server nothing is
        routed to that must not slow the serving ones."""
        spec.write_files()
        log = OutputLog(self.log_path(name), self.max_bytes, self.backups)
        log.write(f"--- specfleet: starting {spec.shell_line()} ---", keep=False)
        parent = os.getpid()

        def in_child() -> None:
            die_with_parent(parent)
            if background:  # before exec: every thread the runtime starts inherits it
                os.nice(BACKGROUND_NICE)

        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,  # own session and process group
                preexec_fn=in_child,
            )
        except OSError:
            log.close()
            raise
        if background:
            give_way(proc.pid)
        self.children.add(name, proc.pid)
        return ChildProcess(proc, log, self.children, name, on_line,
                            signal.Signals[spec.stop_signal])

    def sweep_orphans(self) -> list[str]:
        return self.children.sweep()


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(ProcessLauncher)
