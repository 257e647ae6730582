"""`launcher: external`: the runtime is already running (an existing Ollama server, say)
and is not specfleet's to start or stop. specfleet manages what it can through the
runtime's API (the backend creates and loads the model) and watches its health; a
"restart" re-prepares the model, a stop leaves the server alone. Only backends that say
`supports_external` accept it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from supervisor.config.schema import Target
from supervisor.config.yamlsource import Problem
from supervisor.launcher.running import TargetProcess
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import Launcher, LauncherContext, LauncherTraits

if TYPE_CHECKING:
    from supervisor.plugin.values import LaunchSpec


class AttachedServer(TargetProcess):
    """A RunningProcess for a server specfleet did not start: it "exits" when let go of."""

    def __init__(self) -> None:
        super().__init__(0, None)
        self._exit = asyncio.get_running_loop().create_future()

    def _release(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
            assert self._exit is not None
            self._exit.set_result(code)

    async def stop(self, grace: float) -> int:
        self._release(0)
        return await self.wait()

    def kill(self) -> None:
        self._release(0)  # nothing to kill: the next start prepares the model again


class ExternalLauncher(Launcher):
    name = "external"
    # Nothing of its own runs: the server's memory is in the GPU readings already, and it
    # is neither started nor stopped, so it cannot load on demand or swap.
    traits = LauncherTraits(starts_server=False, local_gpus=False)

    def __init__(self) -> None:
        pass

    @classmethod
    def from_context(cls, context: LauncherContext) -> ExternalLauncher:
        return cls()

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        if target.swaps:
            key = "start" if target.start == "on_demand" else \
                "idle_unload" if target.idle_unload is not None else "group"
            return [Problem((key,), "an external server is not started or stopped by "
                            "specfleet, so it cannot load on demand, unload or swap; remove "
                            f"{key} or use another launcher")]
        return []

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> AttachedServer:
        spec.write_files()
        return AttachedServer()

    def log_path(self, name: str) -> str:
        return "(the external server's own log)"


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(ExternalLauncher)
