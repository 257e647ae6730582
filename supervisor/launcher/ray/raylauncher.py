"""`launcher: ray`: each target is a detached actor `specfleet/<target>` on a node of a Ray
cluster, holding the runtime as its child (launcher/ray/actor.py); docs/ray.md.

Placement is specfleet's: the node is chosen from the fleet file's preference list and
the cluster's free resources (launcher/ray/placement.py), and the actor is pinned there
(node affinity, not soft). Before the runtime starts, the model files are checked on that
node. Actors outlive the daemon; a new daemon adopts one that still runs the command it
would start (same pid: no second server on the port).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from supervisor.config.raysettings import RaySettings
from supervisor.config.schema import Fleet, Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import NotReachableYet, SpecfleetError
from supervisor.launcher.outputlog import OutputLog
from supervisor.launcher.ray.cluster import RayCluster, actor_name, first_line, import_ray
from supervisor.launcher.ray.placement import Choice, NodeView, choose, demand
from supervisor.launcher.ray.process import RayProcess
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import ChildBook, Launcher, LauncherContext, LauncherTraits

if TYPE_CHECKING:
    from supervisor.plugin.values import LaunchSpec

_SUSPECT_FOR = 120.0  # seconds a node that lost an actor of ours stays suspect
# How long a start waits for Ray to tell whether a suspect node is gone: its GCS marks a
# node dead after the node's health checks fail (about 15 s at Ray's defaults).
_SUSPECT_WAIT = 30.0
# Seconds a start waits for a node to fit before giving up: the resources of an actor that
# just ended reach the cluster's books a moment after it is dead.
_SETTLE = 10.0
# Seconds a start waits for the background connection to the cluster (a head that is up
# answers ray.init in a few seconds).
CONNECT_WAIT = 15.0


def num_gpus(target: Target) -> int:
    """GPUs Ray gives the actor: as many as the fleet file lists (Ray picks which ones on
    the node and sets CUDA_VISIBLE_DEVICES; indices in the file are not the node's)."""
    if target.gpus is None or target.gpus == "none":
        return 0
    if target.gpus == "all":
        raise SpecfleetError(f"target '{target.name}': gpus: all has no meaning on a Ray "
                             "cluster; list as many indices as it needs, such as [0, 1]")
    return len(target.gpus)


def fingerprint(spec: LaunchSpec, target: Target) -> str:
    """What the running actor must match to be adopted: the command and where it may run."""
    env = {k: v for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    what = [list(spec.argv), env, spec.cwd, target.ray.model_dump(mode="json"), num_gpus(target)]
    if spec.stop_signal != "SIGTERM":  # only where set: actors started before keep theirs
        what.append(spec.stop_signal)
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def node_files(target: Target) -> tuple[dict[str, str], dict[str, int]]:
    """Model files to check on the node (absolute paths only: a repo id or an Ollama tag is
    not a file), and their sizes where the daemon's machine has them too."""
    files, sizes = {}, {}
    for role, ref in (("model", target.model), ("draft", target.speculation.draft)):
        path = os.path.expanduser(ref) if ref else ""
        if path.startswith("/"):
            files[role] = path
            if os.path.isfile(path):
                sizes[role] = os.path.getsize(path)
    return files, sizes


class RayLauncher(Launcher):
    name = "ray"
    # Actors keep running when the daemon exits (unless stop_targets_on_exit); their GPUs
    # are a node's, which Ray counts, not this machine's VRAM plan.
    traits = LauncherTraits(detaches=True, local_gpus=False, section="ray")

    def __init__(self, settings: RaySettings, log_dir: Path, target_of: Callable[[str], Target],
                 emit: Callable[[str, str], None] | None = None,
                 max_bytes: int = 10 * 1024 * 1024, backups: int = 3,
                 children: ChildBook | None = None) -> None:
        self.cluster = RayCluster(settings, children)
        self.settings = settings
        self.log_dir = log_dir
        self.target_of = target_of
        self.emit = emit  # (target, reason): an event, such as a move to another node
        self.max_bytes, self.backups = max_bytes, backups
        self._last_node: dict[str, str] = {}  # target -> the node it last ran on (described)
        self._suspect: dict[str, float] = {}  # node id -> when it lost an actor of ours
        self._connecting: asyncio.Task[None] | None = None
        self._leftovers_of: Fleet | None = None  # the fleet to clean up after once connected
        self._unreachable = ""  # why the last connection failed

    @classmethod
    def from_context(cls, context: LauncherContext) -> RayLauncher:
        settings = context.settings
        return cls(settings.ray, context.log_dir, context.target_named, context.target_event,
                   settings.log_max_bytes, settings.log_backups, context.children)

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        if target.gpus == "all":
            return [Problem(("gpus",), "gpus: all has no meaning on a Ray cluster; list as "
                            "many indices as the target needs, such as [0, 1]")]
        return []

    @classmethod
    def export_info(cls, target: Target) -> dict[str, Any]:
        # Where the fleet file asks it to run, for a router that knows the nodes.
        return {"ray_nodes": list(target.ray.nodes)} if target.ray.nodes else {}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    # Actors are not orphans to sweep: they are adopted, or removed by remove_leftovers.

    async def prepare(self, fleet: Fleet) -> None:
        """Connect when the fleet has targets on Ray, or names a cluster (whose actors of
        targets removed from the file must be stopped); in the background, so that a
        cluster that is down (ray.init retries its head for minutes) holds up neither the
        API nor the other targets. Targets on Ray wait for the connection in their start."""
        if (self.own_targets(fleet) or fleet.daemon.ray != RaySettings()) \
                and not self.cluster.connected and self._connecting is None:
            self._connecting = asyncio.create_task(self._connect(), name="ray-connect")

    async def _connected(self) -> None:
        """Return once connected; a target's start waits at most CONNECT_WAIT for the
        background connection, then fails as not reachable yet and is retried with backoff
        (an owner inside a start answers no command: a head that is down, which ray.init
        retries for minutes, would hold up the daemon's stop)."""
        if self.cluster.connected:
            return
        import_ray()  # no ray package: a start that cannot work (final), not one to retry
        if self._connecting is None:
            self._connecting = asyncio.create_task(self._connect(), name="ray-connect")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._connecting), CONNECT_WAIT)
        if not self.cluster.connected:
            raise NotReachableYet(f"the Ray cluster at daemon.ray.address "
                                  f"{self.settings.address} does not answer"
                                  + (f" ({self._unreachable})" if self._unreachable else
                                     f" within {CONNECT_WAIT:g}s; still trying"))

    async def _connect(self) -> None:
        address = self.settings.address
        self._say(f"connecting to the Ray cluster at daemon.ray.address {address}; targets "
                  "on Ray start once it answers")
        try:
            await self.cluster.connect()
        except SpecfleetError as exc:
            self._unreachable = str(exc)
            self._say(f"{exc}; targets on Ray try again at their next start")
            return
        finally:
            self._connecting = None
        self._unreachable = ""
        self._say(f"connected to the Ray cluster at daemon.ray.address {address}")
        if self._leftovers_of is not None:  # asked for before the connection was up
            for said in await self.remove_leftovers(self._leftovers_of):
                self._say(said)

    def _say(self, reason: str) -> None:
        if self.emit is not None:
            self.emit("-", reason)

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
        await self.cluster.close()

    def _node_lost(self, node_id: str) -> None:
        self._suspect[node_id] = time.monotonic()

    def _suspects(self) -> frozenset[str]:
        now = time.monotonic()
        return frozenset(n for n, t in self._suspect.items() if now - t < _SUSPECT_FOR)

    async def _place(self, target: Target) -> Choice:
        await self._connected()
        need = demand(num_gpus(target), target.ray.num_cpus, target.ray.resources)
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            waited = loop.time() - began
            # Nodes that just lost an actor are passed over while Ray decides whether they
            # are gone (at most _SUSPECT_WAIT); then tried like any other.
            suspects = self._suspects() if waited < _SUSPECT_WAIT else frozenset()
            choice = choose(await self.cluster.nodes(), target.ray.nodes, need, suspects)
            if not isinstance(choice, str):
                return choice
            if waited >= (_SUSPECT_WAIT if suspects else _SETTLE):
                raise SpecfleetError(f"target '{target.name}' cannot run on the Ray cluster: "
                                     f"{choice}")
            await asyncio.sleep(0.5)

    def _process(self, name: str, handle: object, pid: int, where: dict[str, object],
                 choice: Choice, on_line: Callable[[str], None] | None, seq: int = 0,
                 ) -> RayProcess:
        node = choice.node.describe(choice.name)
        self._last_node[name] = node
        location = {"node": node, "node_id": choice.node.node_id,
                    # The address Ray registered the node under (what `ray start
                    # --node-ip-address` said), not the one the node guesses for itself.
                    "address": choice.node.address or str(where.get("address"))}
        if where.get("gpus"):
            location["node_gpus"] = str(where["gpus"])
        log = OutputLog(self.log_path(name), self.max_bytes, self.backups)
        return RayProcess(self.cluster, handle, pid, location, log, on_line, seq,
                          pid_is_local=_is_this_machine(str(location["address"])),
                          on_node_lost=self._node_lost)

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> RayProcess:
        target = self.target_of(name)
        choice = await self._place(target)
        node = choice.node.describe(choice.name)
        previous = self._last_node.get(name)
        if previous is not None and previous != node and self.emit is not None:
            self.emit(name, f"moved from node {previous} to node {node}")
        if (old := await self.cluster.find_actor(name)) is not None:
            await self.cluster.discard(old)  # a dead or stale actor still holds the name
        handle = self.cluster.create_actor(name, choice.node.node_id, num_gpus(target),
                                           target.ray.num_cpus, dict(target.ray.resources))
        try:
            where = await asyncio.wait_for(handle.where.remote(), self.settings.connect_timeout)
            files, sizes = node_files(target)
            problems = await handle.check_files.remote(files, sizes, spec.argv[0])
            if problems:
                raise SpecfleetError(f"on node {node}: " + "; ".join(problems))
            pid = await handle.start.remote(list(spec.argv), dict(spec.env), spec.cwd,
                                            fingerprint(spec, target), spec.stop_signal)
        except TimeoutError:
            await self.cluster.discard(handle)
            raise SpecfleetError(f"Ray did not place the actor {actor_name(name)} on node "
                                 f"{node} within {self.settings.connect_timeout:g} s") from None
        except self.cluster.errors as exc:  # the node died under it, or Ray refused it
            await self.cluster.discard(handle)
            raise SpecfleetError(f"the actor {actor_name(name)} on node {node} died while "
                                 f"starting: {first_line(exc)}") from None
        except BaseException:
            await self.cluster.discard(handle)
            raise
        proc = self._process(name, handle, pid, where, choice, on_line)
        shown = dataclasses.replace(spec, env={k: v for k, v in spec.env.items()
                                               if k != "CUDA_VISIBLE_DEVICES"})
        proc.note(f"--- specfleet: starting on node {node} (its GPUs: "
                  f"{where.get('gpus') or 'none'}): {shown.shell_line()} ---")
        return proc

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[RayProcess | None, str]:
        """The target's actor if it still runs the command specfleet would start now."""
        target = self.target_of(name)
        await self._connected()
        handle = await self.cluster.find_actor(name)
        if handle is None:
            return None, ""
        try:
            state = await asyncio.wait_for(handle.state.remote(), 10)
            where = await asyncio.wait_for(handle.where.remote(), 10)
        except (TimeoutError, *self.cluster.errors):
            await self.cluster.discard(handle)
            return None, f"{actor_name(name)} did not answer: replaced by a new one"
        if state["returncode"] is not None or not state["pid"]:
            await self.cluster.discard(handle)
            return None, ""
        if state["fingerprint"] != fingerprint(spec, target):
            with contextlib.suppress(TimeoutError, *self.cluster.errors):
                await asyncio.wait_for(handle.stop.remote(stop_grace), stop_grace + 10)
            await self.cluster.discard(handle)
            return None, (f"{actor_name(name)} was running another command (the fleet file or "
                          "a tuning decision changed while specfleet was down): restarted "
                          "with this one")
        choice = _choice_for(await self.cluster.nodes(), str(where["node_id"]), target)
        proc = self._process(name, handle, int(state["pid"]), where, choice, None,
                             int(state["seq"]))
        return proc, (f"adopted {actor_name(name)} on node {proc.location['node']}, still "
                      f"running (pid {proc.pid})")

    async def remove_leftovers(self, fleet: Fleet) -> list[str]:
        """Stop the actors of targets no longer run by Ray in the fleet file."""
        if not self.cluster.connected:
            self._leftovers_of = fleet  # done once prepare()'s connection is up, if it was asked
            return []
        keep, removed = self.own_targets(fleet), []
        for target in await self.cluster.our_actors():
            if target not in keep and (handle := await self.cluster.find_actor(target)):
                await self.cluster.discard(handle)
                removed.append(f"stopped the Ray actor {actor_name(target)}: its target is no "
                               "longer in the fleet file (or no longer uses launcher: ray)")
        return removed


def _choice_for(nodes: list[NodeView], node_id: str, target: Target) -> Choice:
    """How to name an adopted actor's node: by the fleet file's name for it if it has one."""
    node = next((n for n in nodes if n.node_id == node_id),
                NodeView(node_id, "", "", alive=True))
    name = next((p for p in target.ray.nodes if node.matches(p)), None)
    return Choice(node, name or (node.custom_resources() or [node.hostname or node_id[:8]])[0])


def _is_this_machine(address: str) -> bool:
    """Whether a node address is one of this machine's (a node started here)."""
    if address.startswith("127.") or address == "::1":
        return True
    return any(a.address == address for addrs in psutil.net_if_addrs().values() for a in addrs)


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(RayLauncher)
