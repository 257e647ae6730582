"""The embedded default launcher: each target is a child process in its own process group.

No orphans, by three layers:
1. stop() signals the whole process group (SIGTERM, grace, SIGKILL), so helpers
   a runtime forks go with it;
2. every child gets PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it when the
   daemon dies by any means, SIGKILL included;
3. the pids of running children are recorded in the state directory; a daemon
   that starts after an unclean death kills any recorded process group that is
   still alive (same pid and start time, so a recycled pid is never hit).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections import deque
from collections.abc import Callable
from logging.handlers import RotatingFileHandler
from pathlib import Path

import psutil

from supervisor.atomicfile import LOG_ONLY, StateReport, read_state, write_json
from supervisor.gpu import oom
from supervisor.plugin.backend import LaunchSpec

PR_SET_PDEATHSIG = 1
_TAIL_LINES = 200


def die_with_parent(parent_pid: int) -> None:
    """Runs in the child between fork and exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may have died before prctl took effect: then nobody would kill us.
    if os.getppid() != parent_pid:
        os._exit(1)


class _DroppingHandler(RotatingFileHandler):
    """A line that cannot be written (a full disk) is dropped from the file, quietly:
    logging's default prints a traceback per line to the daemon's stderr. The line stays in
    the in-memory tail, and the state dir's health is reported by the state files' writers."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class OutputLog:
    """A target's stdout+stderr: a rotating file on disk and the last lines in memory."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._handler: RotatingFileHandler | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = _DroppingHandler(path, maxBytes=max_bytes, backupCount=backups,
                                             encoding="utf-8")
        except OSError:  # a full or read-only disk must not stop the target from starting
            return
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, line: str, keep: bool = True) -> None:
        if keep:
            self.tail.append(line)
        if self._handler is not None:
            self._handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def close(self) -> None:
        if self._handler is not None:
            with contextlib.suppress(OSError):  # its last buffered lines, on a full disk
                self._handler.close()


async def pump(stream: asyncio.StreamReader, log: OutputLog,
               on_line: Callable[[str], None] | None) -> None:
    """Each line of a runtime's output into its log (and to `on_line`) until EOF."""
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip("\n")
        log.write(text)
        if on_line is not None:
            on_line(text)


class ChildRegistry:
    """pids of running children in <state_dir>/children.json, for the orphan sweep. The
    daemon's view is kept here and the file rewritten from it: a write that fails (a full
    disk) is reported to `report`, never raised, and catches up when retried."""

    def __init__(self, path: Path, report: StateReport = LOG_ONLY) -> None:
        self.path = path
        self.report = report
        self._data: dict[str, dict[str, float]] | None = None

    def _read(self) -> dict[str, dict[str, float]]:
        if self._data is None:
            self._data = read_state(self.path, self.report)
        return self._data

    def _write(self, data: dict[str, dict[str, float]]) -> None:
        self._data = data
        self.report.attempt(self.path.name, lambda: write_json(self.path, self._data))

    def add(self, name: str, pid: int) -> None:
        data = self._read()
        with contextlib.suppress(psutil.Error):
            data[name] = {"pid": pid, "create_time": psutil.Process(pid).create_time()}
            self._write(data)

    def remove(self, name: str, pid: int) -> None:
        data = self._read()
        if data.get(name, {}).get("pid") == pid:
            del data[name]
            self._write(data)

    def sweep(self) -> list[str]:
        killed = []
        for name, entry in self._read().items():
            try:
                proc = psutil.Process(int(entry["pid"]))
                if abs(proc.create_time() - float(entry["create_time"])) > 0.01:
                    continue  # the pid was recycled: not ours
                _kill(proc.pid)
                killed.append(f"{name} (pid {proc.pid})")
            except (psutil.Error, ProcessLookupError, KeyError, ValueError, TypeError):
                continue
        self._write({})
        return killed


def _kill(pid: int) -> None:
    """A runtime with its process group (it leads one); a process of a private Ray cluster,
    which leads none, alone."""
    if os.getpgid(pid) == pid:
        os.killpg(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)


class ChildProcess:
    def __init__(self, proc: asyncio.subprocess.Process, log: OutputLog,
                 registry: ChildRegistry, name: str,
                 on_line: Callable[[str], None] | None = None) -> None:
        self._proc = proc
        self._on_line = on_line
        self._log = log
        self._registry = registry
        self._name = name
        self._killed_by_us = False
        # The kernel OOM killer leaves no message: compare the cgroup's oom_kill counter.
        self._cgroup = oom.cgroup_of(proc.pid)
        self._oom_kills = oom.oom_kills(self._cgroup)
        self._reader = asyncio.create_task(self._pump(), name=f"output:{name}")
        self._exit = asyncio.create_task(self._reap(), name=f"reap:{name}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def _pump(self) -> None:
        assert self._proc.stdout is not None
        await pump(self._proc.stdout, self._log, self._on_line)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def _reap(self) -> int:
        code = await self._proc.wait()
        # The group may outlive its leader (a forked helper): it must not.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=5)
        if not self._reader.done():
            self._reader.cancel()
        self._registry.remove(self._name, self.pid)
        self._log.write(f"--- specfleet: pid {self.pid} exited with status {code} ---", keep=False)
        self._log.close()
        return code

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
            self._signal_group(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.wait(), timeout=grace)
            except TimeoutError:
                self.kill()
        return await self.wait()

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._log.tail)[-lines:])


class ProcessLauncher:
    name = "process"
    detaches = False  # children die with the daemon (PR_SET_PDEATHSIG)

    def __init__(self, log_dir: Path, state_dir: Path, max_bytes: int = 10 * 1024 * 1024,
                 backups: int = 3) -> None:
        self.log_dir = log_dir
        self.max_bytes = max_bytes
        self.backups = backups
        self.children = ChildRegistry(state_dir / "children.json")

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[ChildProcess | None, str]:
        return None, ""  # a child never outlives its daemon: nothing to adopt

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> ChildProcess:
        spec.write_files()
        log = OutputLog(self.log_path(name), self.max_bytes, self.backups)
        log.write(f"--- specfleet: starting {spec.shell_line()} ---", keep=False)
        parent = os.getpid()
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **spec.env},
                cwd=spec.cwd,
                start_new_session=True,  # own session and process group
                preexec_fn=lambda: die_with_parent(parent),
            )
        except OSError:
            log.close()
            raise
        self.children.add(name, proc.pid)
        return ChildProcess(proc, log, self.children, name, on_line)

    def sweep_orphans(self) -> list[str]:
        return self.children.sweep()
