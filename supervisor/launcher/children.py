"""The daemon's record of the processes it started on this machine, for the orphan sweep:
a daemon that starts after an unclean death kills any recorded process group that is
still alive (same pid and start time, so a recycled pid is never hit)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import psutil

from supervisor.atomicfile import LOG_ONLY, StateReport, read_state, write_json
from supervisor.launcher import processstamp


class ChildRegistry:
    """pids of running children in <state_dir>/children.json, for the orphan sweep. The
    daemon's view is kept here and the file rewritten from it: a write that fails (a full
    disk) is reported to `report`, never raised, and catches up when retried."""

    def __init__(self, path: Path, report: StateReport = LOG_ONLY) -> None:
        self.path = path
        self.report = report
        self._data: dict[str, dict[str, Any]] | None = None

    def _read(self) -> dict[str, dict[str, Any]]:
        if self._data is None:
            self._data = read_state(self.path, self.report)
        return self._data

    def _write(self, data: dict[str, dict[str, Any]]) -> None:
        self._data = data
        self.report.attempt(self.path.name, lambda: write_json(self.path, self._data))

    def add(self, name: str, pid: int) -> None:
        """A target may have two children for a while (a new server started beside the old
        one): the second is kept under `name@pid`."""
        data = self._read()
        key = name if name not in data else f"{name}@{pid}"
        with contextlib.suppress(psutil.Error):
            data[key] = processstamp.stamp(pid)
            self._write(data)

    def remove(self, name: str, pid: int) -> None:
        data = self._read()
        keys = [k for k, entry in data.items()
                if k.split("@", 1)[0] == name and entry.get("pid") == pid]
        for key in keys:
            del data[key]
        if keys:
            self._write(data)

    def sweep(self) -> list[str]:
        killed = []
        for name, entry in self._read().items():
            try:
                if not processstamp.same_process(entry):
                    continue  # gone, or the pid was recycled: not ours
                _kill(int(entry["pid"]))
                killed.append(f"{name.split('@', 1)[0]} (pid {entry['pid']})")
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
