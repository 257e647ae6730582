"""The daemon's connection to the Ray cluster: connect, read the nodes, create and find the
targets' actors, kill them. Thin I/O around Ray's blocking calls, which run in threads so
that the event loop never waits on the cluster.

Ray is an optional extra (`pip install 'specfleet[ray]'`): it is imported here, at the
first use, and a daemon without `launcher: ray` targets never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import psutil

from supervisor.config.raysettings import RaySettings
from supervisor.errors import SpecfleetError
from supervisor.launcher.ray import actor as actor_module
from supervisor.launcher.ray.placement import NodeView, nodes_from
from supervisor.plugin.launching import ChildBook

ACTOR_PREFIX = "specfleet/"


def import_ray() -> ModuleType:
    # Before Ray reads its constants: no failure signal handler in the daemon (see _OURS).
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray
    except ImportError:
        raise SpecfleetError("launcher: ray needs the ray package: pip install "
                             "'specfleet[ray]' (the same Ray version as the cluster's)") from None
    return ray


def first_line(exc: BaseException) -> str:
    """A Ray error's first line (its messages run to a dozen lines of context)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def actor_name(target: str) -> str:
    return f"{ACTOR_PREFIX}{target}"


# Ray's core worker installs abseil's failure signal handler when ray.init connects, for
# SIGTERM among the crash signals: it writes a stack trace through Ray's logger, then hands
# the signal on. Not async-signal-safe: a SIGTERM that came while another thread held the
# logger's lock ended the daemon with SIGABRT before it stopped a single target (a daemon
# stopped right after it adopted an actor), and one that came while ray.init still ran (in
# its thread, before the daemon's handler could come back) ended a daemon that had stopped
# every target with SIGABRT all the same (tests/daemon/test_sigterm_live.py). So the handler is
# not installed at all (RAY_DISABLE_FAILURE_SIGNAL_HANDLER, read when Ray is imported), and
# where it was anyway (an environment that set the variable to 0), SIGTERM's comes back.
_OURS = (signal.SIGTERM,)


def take_back() -> None:
    """Install the Python handlers of the signals Ray takes again at the C level, over what
    Ray installed meanwhile. The handlers as they are now, not as they were when the connect
    began: the daemon's own SIGTERM handler may have come in between (the connect starts
    before the loop's handlers), and putting back the older default made the next SIGTERM
    kill the daemon outright (exit -15, nothing stopped)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (the daemon's loop runs there)
    for sig in _OURS:
        handler = signal.getsignal(sig)  # Python's own record: Ray's C handler is not in it
        if handler is not None:
            signal.signal(sig, handler)


class LastingThread:
    """One daemon thread that runs the blocking calls given to it, for the daemon's whole
    life. Not a thread per call: ray.init starts a private cluster's processes with a
    parent-death signal, which Linux sends when the *thread* that started them ends (a
    thread that ended after ray.init killed the `local` cluster's GCS a minute later). Not
    asyncio.to_thread's pool: it is joined at exit, and ray.init retries a head that is
    down for minutes; a daemon thread is never waited for."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="ray", daemon=True)
            self._thread.start()
        self._jobs.put((loop, done, fn, args))
        return await done

    def _work(self) -> None:
        while True:
            loop, done, fn, args = self._jobs.get()
            try:
                result, exc = fn(*args), None
            except BaseException as caught:  # handed to the awaiting task
                result, exc = None, caught
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(_settle, done, result, exc)


def _settle(done: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if done.done():  # the awaiting task was cancelled
        return
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(result)


class RayCluster:
    def __init__(self, settings: RaySettings, children: ChildBook | None = None) -> None:
        self.settings = settings
        # A private cluster's processes are recorded with the process launcher's children, so
        # that the orphan sweep of a daemon started after a kill -9 removes those that outlive
        # it (the raylet's agents do; the raylet, GCS and workers die with the daemon).
        self.children = children
        self._local: list[psutil.Process] = []
        self._ray: ModuleType | None = None
        self._actor_class: Any = None
        self._lock = asyncio.Lock()
        self._thread = LastingThread()
        # Each node's resources while it was alive: Ray lists a dead node without them.
        self._seen_resources: dict[str, dict[str, float]] = {}

    @property
    def connected(self) -> bool:
        return self._ray is not None

    @property
    def ray(self) -> ModuleType:
        assert self._ray is not None, "connect() first"
        return self._ray

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        """What a call on a dead or unreachable actor raises."""
        return (self.ray.exceptions.RayError,)

    async def connect(self) -> None:
        async with self._lock:
            if self._ray is None:
                ray = import_ray()
                try:
                    await self._thread.run(self._init, ray)  # see LastingThread
                finally:
                    take_back()
                self._ray = ray

    def _init(self, ray: ModuleType) -> None:
        # In a thread: ray.init then leaves the daemon's SIGTERM handling alone (it installs
        # its own handler only from the main thread).
        # "local" as Ray spells it: a new private cluster. (None would join the cluster that
        # `ray start` last ran on this machine, if there is one.)
        address = self.settings.address
        try:
            if not ray.is_initialized():
                ray.init(address=address, namespace=self.settings.namespace,
                         log_to_driver=False, include_dashboard=False if address == "local"
                         else None, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SpecfleetError(f"cannot reach the Ray cluster at daemon.ray.address "
                                 f"{self.settings.address}: {exc}") from None
        if address == "local":
            self._record_local()
        # Ship actor.py by value: the nodes need Ray, not specfleet.
        ray.cloudpickle.register_pickle_by_value(actor_module)
        self._actor_class = ray.remote(actor_module.TargetActor)

    async def nodes(self) -> list[NodeView]:
        def read() -> list[NodeView]:
            # No public per-node "available" call without the dashboard's state API.
            from ray._private import state
            return nodes_from(self.ray.nodes(), state.available_resources_per_node(),
                              self._seen_resources)
        return await asyncio.to_thread(read)

    def create_actor(self, target: str, node_id: str, num_gpus: int, num_cpus: float,
                     resources: dict[str, float]) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        # Detached: the actor outlives the daemon, to be adopted. No restarts by Ray: the
        # restart policy, backoff and give-up are specfleet's.
        return self._actor_class.options(
            name=actor_name(target), namespace=self.settings.namespace, lifetime="detached",
            max_restarts=0, max_task_retries=0, num_gpus=num_gpus, num_cpus=num_cpus,
            resources=resources or None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(target)

    async def find_actor(self, target: str) -> Any | None:
        def get() -> Any | None:
            try:
                return self.ray.get_actor(actor_name(target), namespace=self.settings.namespace)
            except ValueError:  # no such actor
                return None
        return await asyncio.to_thread(get)

    async def discard(self, handle: Any, timeout: float = 10.0) -> None:
        """Kill an actor and wait until Ray has it dead (its name and resources free)."""
        with contextlib.suppress(*self.errors):
            await asyncio.to_thread(self.ray.kill, handle, no_restart=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                await asyncio.wait_for(handle.ping.remote(), 1.0)
            except self.errors:
                return
            except TimeoutError:
                pass
            await asyncio.sleep(0.2)

    async def our_actors(self) -> list[str]:
        """Targets that have an actor in our namespace."""
        names = await asyncio.to_thread(self.ray.util.list_named_actors)
        return sorted(n[len(ACTOR_PREFIX):] for n in names if n.startswith(ACTOR_PREFIX))

    async def close(self) -> None:
        """A private cluster (`local`) goes with the daemon. Ray's shutdown stops the processes
        ray.init started, not the agents its raylet started, which would outlive the daemon
        (seen: `ray::DashboardAgent` and `ray::RuntimeEnvAgent`). A shared cluster stays."""
        if self._ray is None or self.settings.address != "local":
            return
        await asyncio.to_thread(self._shut_down_local)

    def _record_local(self) -> None:
        # Every descendant now is the new cluster's: no runtime has been started yet.
        self._local = psutil.Process().children(recursive=True)
        if self.children is not None:
            for proc in self._local:
                self.children.add(_local_entry(proc), proc.pid)

    def _shut_down_local(self) -> None:
        # Listed before the shutdown: once the raylet is gone its agents are nobody's children.
        # By now every other child of the daemon (a process launcher's runtime) has stopped.
        family = psutil.Process().children(recursive=True)
        self.ray.shutdown()
        self._ray = None
        for proc in family:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(family, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.children is not None:
            for proc in self._local:
                self.children.remove(_local_entry(proc), proc.pid)


def _local_entry(proc: psutil.Process) -> str:
    return f"ray local cluster: {proc.pid}"
