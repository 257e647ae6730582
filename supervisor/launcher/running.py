"""The record of a running target that every built-in launcher shares: its pid, its exit
status once known, the wait on the task that reaps it, its output tail, and the
background tasks a kill starts. Each launcher's process adds only how it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from supervisor.launcher.outputlog import OutputLog
from supervisor.plugin.launching import RunningProcess


class TargetProcess(RunningProcess):
    def __init__(self, pid: int, log: OutputLog | None) -> None:
        self._pid = pid
        self._log = log
        self._returncode: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._exit: asyncio.Future[int] | None = None  # set by the subclass: its reaper

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        assert self._exit is not None, "the subclass starts its reaper in __init__"
        return await asyncio.shield(self._exit)

    def output_tail(self, lines: int = 20) -> str:
        return "\n".join(list(self._log.tail)[-lines:]) if self._log is not None else ""

    def _background(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        """Run `work` without waiting for it (a kill through a manager), holding the task
        so that it is not garbage-collected half-way."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ended(self, code: int, line: str) -> int:
        """The exit is known: say so in the log (not in the runtime's tail) and close it."""
        if self._log is not None:
            self._log.write(f"--- specfleet: {line} ---", keep=False)
            self._log.close()
        self._returncode = code
        return code
