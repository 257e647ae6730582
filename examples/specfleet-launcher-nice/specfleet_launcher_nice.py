"""`launcher: nice`: the runtime as a child of the daemon at a lower CPU priority (nice 10,
or a target's `launcher_settings: {niceness: N}`), so that a model server on a shared
home-lab machine yields the CPU to interactive work.

A third-party launcher, written against the public plugin API only (`supervisor.plugin`):
a child in its own process group that dies with the daemon (PR_SET_PDEATHSIG), recorded
in the daemon's book of children so that the next daemon's orphan sweep finds it after a
kill -9, its output in `<logs>/<target>.log` and its last lines in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections import deque
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from supervisor.plugin import (
    Launcher,
    LauncherContext,
    LauncherTraits,
    LaunchSpec,
    RunningProcess,
    hookimpl,
)

_PR_SET_PDEATHSIG = 1


class NiceSettings(BaseModel):
    """A target's `launcher_settings:` under `launcher: nice` (checked by `specfleet check`
    with the file's line, as every key)."""

    model_config = ConfigDict(extra="forbid")
    niceness: int = Field(default=10, ge=0, le=19)


def _child_setup(parent: int, niceness: int) -> None:
    """Between fork and exec: die with the daemon, at the lower priority."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    os.nice(niceness)


class NicedProcess(RunningProcess):
    def __init__(self, proc: asyncio.subprocess.Process, log_path: str, name: str,
                 context: LauncherContext, on_line: Callable[[str], None] | None) -> None:
        self._proc = proc
        self._name = name
        self._context = context
        self._tail: deque[str] = deque(maxlen=200)
        self._log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed at exit
        self._on_line = on_line
        self._exit = asyncio.create_task(self._follow(), name=f"nice:{name}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def _follow(self) -> int:
        assert self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            text = line.decode(errors="replace").rstrip("\n")
            self._tail.append(text)
            self._log.write(text + "\n")
            self._log.flush()
            if self._on_line is not None:
                self._on_line(text)
        code = await self._proc.wait()
        self._signal(signal.SIGKILL)  # what the runtime forked goes with it
        self._context.children.remove(self._name, self.pid)
        self._log.close()
        return code

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def stop(self, grace: float) -> int:
        if self._proc.returncode is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.wait(), timeout=grace)
            except TimeoutError:
                self.kill()
        return await self.wait()

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._tail)[-lines:])


class NiceLauncher(Launcher):
    name = "nice"
    traits = LauncherTraits()  # a child of the daemon on this machine, like `process`
    settings = NiceSettings

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> NicedProcess:
        spec.write_files()
        log_path = self.context.log_dir / f"{name}.log"  # where log_path() says
        log_path.parent.mkdir(parents=True, exist_ok=True)
        parent = os.getpid()
        settings = self.settings_for(self.context.target_named(name))
        niceness = settings.niceness if isinstance(settings, NiceSettings) else 10
        proc = await asyncio.create_subprocess_exec(
            *spec.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, **spec.env}, cwd=spec.cwd,
            start_new_session=True, preexec_fn=lambda: _child_setup(parent, niceness))
        self.context.children.add(name, proc.pid)
        return NicedProcess(proc, str(log_path), name, self.context, on_line)


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(NiceLauncher)
