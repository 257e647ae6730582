"""The launcher contract: how a target's process runs (docs/plugins.md).

A launcher is a class registered through the `specfleet.launchers` entry points, the
built-in ones (process, systemd, external, ray, container) exactly like a third party's.
What the rest of specfleet needs to know about a launcher is data on the class, its
`traits`, never its name: the VRAM plan asks `traits.local_gpus`, a backend asks
`traits.in_image`, the owner task asks `traits.detaches`. Everything a launcher does
beyond starting a process (connecting to its manager, removing what a removed target left
behind, a command's view of the process) has a default here that does nothing, so a
launcher implements only what it has.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from supervisor.atomicfile import LOG_ONLY, StateReport
from supervisor.config.schema import Daemon, Fleet, Target
from supervisor.config.yamlsource import Problem
from supervisor.plugin.executor import LOCAL, Executor
from supervisor.plugin.values import LaunchSpec


@dataclass(frozen=True)
class LauncherTraits:
    """What a launcher's targets are like, for the code that is not the launcher."""

    starts_server: bool = True  # False: it attaches to a server specfleet did not start
    detaches: bool = False  # what it started outlives the daemon and is adopted at its return
    local_gpus: bool = True  # the runtime uses this machine's GPUs (the VRAM plan counts it)
    in_image: bool = False  # the runtime's executable is in an image, not on this machine
    section: str | None = None  # the target key only this launcher reads (`ray:`, ...)
    # It can run a second server for the same target at once, on another port (a planned
    # restart then starts the new one beside the old: supervision/handover.py).
    beside: bool = False


_DECLARED: dict[str, LauncherTraits] = {}


def declare(name: str, traits: LauncherTraits) -> None:
    """The registry declares each installed launcher's traits once it has found them."""
    _DECLARED[name] = traits


def traits_for(name: str) -> LauncherTraits:
    """The traits of the launcher called `name` in the fleet file. One no registry has
    declared (a backend built alone, in a test) is taken for a child process's."""
    return _DECLARED.get(name, LauncherTraits())


class RunningProcess(abc.ABC):
    """A started target, whatever runs it. Launchers subclass it (the built-in ones through
    launcher/running.py); `pid_is_local` and `location` say where it runs."""

    pid: int  # 0 where nothing of the launcher's own runs (an external server)
    returncode: int | None  # None while running; negative for death by signal, as subprocess
    pid_is_local: bool = True  # the pid names a process in this machine's /proc
    location: dict[str, str] = {}  # noqa: RUF012 - {"node", "node_id", "address"} on another node

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for exit (and for its output to be drained); return the exit status."""
        raise NotImplementedError

    @abc.abstractmethod
    async def stop(self, grace: float) -> int:
        """SIGTERM, `grace` seconds, then SIGKILL; everything the process started goes too."""
        raise NotImplementedError

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL at once (a hung or stopped process does not answer SIGTERM)."""
        raise NotImplementedError

    def output_tail(self, lines: int = 20) -> str:
        """The last lines the runtime wrote to stdout/stderr."""
        return ""

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended the process (as far as can be seen)."""
        return False


def local_pid(proc: RunningProcess) -> int:
    """The pid to read in this machine's /proc (CPU time, memory), or 0 when the process
    runs on another machine and its pid means nothing here."""
    return proc.pid if proc.pid_is_local else 0


class ChildBook(Protocol):
    """The daemon's record of the processes it started on this machine (the orphan sweep
    after an unclean death reads it)."""

    def add(self, name: str, pid: int) -> None: ...

    def remove(self, name: str, pid: int) -> None: ...


@dataclass
class LauncherContext:
    """What the daemon gives every launcher it builds."""

    settings: Daemon
    state_dir: Path
    target_named: Callable[[str], Target]  # the definition a target's owner runs now
    target_event: Callable[[str, str], None]  # (target, reason): a placement event
    children: ChildBook
    report: StateReport = LOG_ONLY

    @property
    def log_dir(self) -> Path:
        return self.settings.logs.expanduser()


class Launcher(abc.ABC):
    """Base class of every launcher. `name` is the fleet file's `launcher:` value."""

    name: ClassVar[str] = ""
    traits: ClassVar[LauncherTraits] = LauncherTraits()
    # A third-party launcher's settings (a target's `launcher_settings:`), as a pydantic
    # model: the fleet file is checked against it (file:line errors, as for every key), and
    # `settings_for` hands the launcher its typed value. None: it takes none.
    settings: ClassVar[type[BaseModel] | None] = None

    def __init__(self, context: LauncherContext) -> None:
        self.context = context

    @classmethod
    def from_context(cls, context: LauncherContext) -> Launcher:
        """The launcher the daemon uses (built-in launchers also take plain arguments, for
        the commands and tests that build one alone)."""
        return cls(context)

    # --- the fleet file (class methods: no daemon needed) ---

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        """This launcher's own checks of a target on it; paths are relative to the target."""
        return []

    @classmethod
    def settings_for(cls, target: Target) -> BaseModel | None:
        """The target's `launcher_settings` as this launcher's settings model (checked at
        load: `check` and `run` refuse a file where they do not validate)."""
        return cls.settings.model_validate(target.launcher_settings) if cls.settings else None

    @classmethod
    def export_info(cls, target: Target) -> dict[str, Any]:
        """What a router's export says of where the target runs (LiteLLM's model_info)."""
        return {}

    # --- running a target ---

    @abc.abstractmethod
    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> RunningProcess:
        """Start the target; `on_line` gets each output line where the launcher sees them."""
        raise NotImplementedError

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[RunningProcess | None, str]:
        """A target still running from a previous daemon, if it runs `spec`; and why not."""
        return None, ""

    def log_path(self, name: str) -> object:
        """Where the target's output goes (a file, or how to read the journal)."""
        return self.context.log_dir / f"{name}.log"

    async def runtime_host(self, name: str) -> Executor:
        """Where the target's runtime commands run (a backend's preflight): this machine,
        or the image a launcher runs targets in."""
        return LOCAL

    def describe(self, name: str, spec: LaunchSpec) -> str | None:
        """How the target is run beyond its command line, for `specfleet check`."""
        return None

    # --- the daemon's life (every launcher is asked; most have nothing to do) ---

    def sweep_orphans(self) -> list[str]:
        """Kill what a previous daemon that died uncleanly left running; say what."""
        return []

    async def prepare(self, fleet: Fleet) -> None:
        """Before targets of `fleet` start (at start, and before a reload applies it):
        connect to what this launcher needs, if the fleet or what it left behind uses it."""
        return None  # a default that does nothing: most launchers need no connection

    async def discard(self, name: str) -> str:
        """At daemon start, for a target that starts unloaded (it swaps: nothing adopts it):
        stop and remove what a previous daemon that did not stop cleanly left running for
        it; say what, or "". Only launchers whose targets detach have anything to do."""
        return ""

    async def remove_leftovers(self, fleet: Fleet) -> list[str]:
        """Stop and remove what this launcher runs for targets that `fleet` no longer gives
        it (removed, or moved to another launcher); one sentence per thing removed."""
        return []

    async def close(self) -> None:
        """The daemon is stopping: let go of connections (targets are stopped already)."""
        return None

    # --- helpers for subclasses ---

    def own_targets(self, fleet: Fleet) -> set[str]:
        return {n for n, t in fleet.targets.items() if t.launcher == self.name}
