"""The launcher interface. The per-target state machine does not care which launcher runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from supervisor.plugin.backend import LaunchSpec
from supervisor.plugin.executor import LOCAL, Executor


class RunningProcess(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None:
        """None while running; negative for death by signal, as in subprocess."""

    async def wait(self) -> int:
        """Wait for exit (and for its output to be drained); return the exit status."""

    async def stop(self, grace: float) -> int:
        """SIGTERM, `grace` seconds, then SIGKILL; everything the process started goes too."""

    def kill(self) -> None:
        """SIGKILL at once (a hung or stopped process does not answer SIGTERM)."""

    def output_tail(self, lines: int = 20) -> str:
        """The last lines the runtime wrote to stdout/stderr."""

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended the process (as far as can be seen)."""


class Launcher(Protocol):
    name: str
    detaches: bool  # whether targets it started may outlive the daemon (and be adopted)

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> RunningProcess:
        """Start the target; `on_line` gets each output line where the launcher sees them."""

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[RunningProcess | None, str]:
        """A target still running from a previous daemon, if it runs `spec`; and why."""

    def log_path(self, name: str) -> object:
        """Where the target's output goes (a file, or how to read the journal)."""

    def sweep_orphans(self) -> list[str]:
        """Kill what a previous daemon that died uncleanly left running; say what was killed."""


def location(proc: RunningProcess) -> dict[str, str]:
    """Where a process runs when a launcher places it on another machine (a Ray node):
    {"node": name, "node_id": id, "address": IP}; {} for a process on this machine. An
    optional attribute, so that launchers without nodes need not say anything."""
    return dict(getattr(proc, "location", None) or {})


def local_pid(proc: RunningProcess) -> int:
    """The pid to read in this machine's /proc (CPU time, memory), or 0 when the process
    runs on another machine and its pid means nothing here."""
    return proc.pid if getattr(proc, "pid_is_local", True) else 0


async def runtime_host(launcher: Launcher, name: str) -> Executor:
    """Where a target's runtime commands run (a backend's preflight): this machine, or the
    image of a launcher that runs targets in containers (its optional `runtime_host`)."""
    where = getattr(launcher, "runtime_host", None)
    return LOCAL if where is None else await where(name)
