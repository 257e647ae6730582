"""`launcher: external`: the runtime is already running (an existing Ollama server, say)
and is not specfleet's to start or stop. specfleet manages what it can through the
runtime's API (the backend creates and loads the model) and watches its health; a
"restart" re-prepares the model, a stop leaves the server alone. Only backends that say
`supports_external` accept it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from supervisor.plugin.backend import LaunchSpec


class AttachedServer:
    """A RunningProcess for a server specfleet did not start: it "exits" when let go of."""

    pid = 0

    def __init__(self) -> None:
        self._returncode: int | None = None
        self._released = asyncio.get_running_loop().create_future()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def _release(self, code: int) -> None:
        if self._returncode is None:
            self._returncode = code
            self._released.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._released)

    async def stop(self, grace: float) -> int:
        self._release(0)
        return await self.wait()

    def kill(self) -> None:
        self._release(0)  # nothing to kill: the next start prepares the model again

    def output_tail(self, lines: int = 20) -> str:
        return ""

    def oom_killed(self) -> bool:
        return False


class ExternalLauncher:
    name = "external"
    detaches = False

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> AttachedServer:
        spec.write_files()
        return AttachedServer()

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[AttachedServer | None, str]:
        return None, ""

    def log_path(self, name: str) -> str:
        return "(the external server's own log)"

    def sweep_orphans(self) -> list[str]:
        return []
