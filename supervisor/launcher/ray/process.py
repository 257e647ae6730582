"""RayProcess: a target's runtime held by its actor on a Ray node, as a RunningProcess.

The daemon long-polls the actor for output lines and writes them to the target's log
file (and to the backend's line hook), as the process launcher does for a local child.
An actor that dies with its node (raylet killed, machine gone) ends the process as a
SIGKILL, with a line in the log and the tail saying which node was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from supervisor.launcher.outputlog import OutputLog
from supervisor.launcher.ray.cluster import first_line
from supervisor.launcher.running import TargetProcess

if TYPE_CHECKING:
    from supervisor.launcher.ray.cluster import RayCluster

_POLL = 5.0  # seconds a read of new output lines waits on the node (a long poll)
_KILL_ESCALATION = 2.0  # seconds after a SIGKILL through the actor before the actor itself


class RayProcess(TargetProcess):
    def __init__(self, cluster: RayCluster, handle: Any, pid: int, location: dict[str, str],
                 log: OutputLog, on_line: Callable[[str], None] | None = None,
                 seq: int = 0, pid_is_local: bool = True,
                 on_node_lost: Callable[[str], None] | None = None) -> None:
        super().__init__(pid, log)
        self._cluster = cluster
        self.handle = handle
        self.location = location  # the node it runs on
        self.pid_is_local = pid_is_local  # a node of this machine: /proc can read the pid
        self._output = log
        self._on_line = on_line
        self._on_node_lost = on_node_lost
        self._seq = seq
        self._reader = asyncio.create_task(self._pump(), name=f"output:{location['node']}")
        self._exit = asyncio.create_task(self._reap(), name=f"reap:{location['node']}")

    async def _pump(self) -> None:
        while True:
            try:
                seq, lines, code = await self.handle.read.remote(self._seq, _POLL)
            except self._cluster.errors:
                return  # the actor is gone: _reap says why
            if seq - self._seq > len(lines):
                self._output.write(f"--- specfleet: {seq - self._seq - len(lines)} lines lost "
                                "(the node kept fewer than were written) ---", keep=False)
            self._seq = seq
            for line in lines:
                self._output.write(line)
                if self._on_line is not None:
                    self._on_line(line)
            if code is not None and not lines:
                return

    async def _reap(self) -> int:
        try:
            code = await self.handle.wait.remote()
        except self._cluster.errors as exc:
            code = -signal.SIGKILL
            self._output.write(f"--- specfleet: the actor on node {self.location['node']} is gone "
                            f"(its node died, or it was killed): {first_line(exc)} ---")
            if self._on_node_lost is not None:
                self._on_node_lost(self.location.get("node_id", ""))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=5)
        if not self._reader.done():
            self._reader.cancel()
        # The actor has nothing left to hold: it goes, and its GPUs and resources with it.
        await self._cluster.discard(self.handle)
        return self._ended(code, f"pid {self.pid} on node {self.location['node']} exited with "
                                 f"status {code}")

    async def stop(self, grace: float) -> int:
        if self._returncode is None and not self._exit.done():
            with contextlib.suppress(*self._cluster.errors):
                await self.handle.stop.remote(grace)
        return await self.wait()

    def kill(self) -> None:
        self._background(self._kill(), f"kill:{self.location['node']}")

    async def _kill(self) -> None:
        """SIGKILL to the runtime's group through the actor; an actor that cannot act on it
        (its node unreachable, its loop stuck) is killed by Ray, and the runtime with it
        (PR_SET_PDEATHSIG)."""
        with contextlib.suppress(TimeoutError, *self._cluster.errors):
            await asyncio.wait_for(self.handle.kill.remote(), _KILL_ESCALATION)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exit), _KILL_ESCALATION)
            return
        await self._cluster.discard(self.handle)

    def note(self, line: str) -> None:
        """A line of specfleet's own in the target's log (not in the runtime's tail)."""
        self._output.write(line, keep=False)

    def oom_killed(self) -> bool:
        return False  # the node's cgroup counters are not read (docs/ray.md)
