"""A planned restart that costs no service: the new server starts beside the old one.

A retune or a restart through the API would otherwise stop the server and start it again:
seconds to minutes with nothing served (a model load), paid at every candidate the tuner
measures. Here, as in a blue-green deploy:

1. whether it may: `restart.replace`, the launcher's `beside` trait, the proxy (with `auto`),
   and room for both (the VRAM plan's live check on a GPU, host memory on the CPU);
2. the new server starts on another port and loads while the old one serves;
3. once its health check passes, the proxy's new requests go to it (the route changes:
   requests.py), and the owner supervises it;
4. the old one finishes the requests it has (up to `health.start_timeout`), then stops.
   Where both compute on the host's CPU cores, new requests wait for those (up to
   CPU_HOLD) before they go to the new server.

Anything that goes wrong before 3 (no room, a refused start, a server that exits or never
becomes ready) leaves the old one serving, and the owner restarts in place as before, where
the crash handling shows the runtime's own output; the event says why. A command that
arrives while the new server loads (a shutdown, an unload) is handled at once: the new
server is killed and the command takes effect on the old one.

Clients that talk to the runtime's own port see it move: the new server listens on a free
port (the configured one again at the next such restart, when it is free).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import psutil

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError, StartRefused
from supervisor.events import Event, EventBus
from supervisor.gpu.placement import Placer
from supervisor.gpu.vram import gib
from supervisor.plugin.backend import Backend, LaunchSpec
from supervisor.plugin.launching import Launcher, RunningProcess
from supervisor.supervision.commands import Request
from supervisor.supervision.probes import until_ready
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.runrecord import RunRecorder
from supervisor.supervision.start import StartPlan, follow, plan_start
from supervisor.supervision.states import StateChanges
from supervisor.tuning.autotuner import AutoTuner

# Host memory left over once both servers run: the daemon, the page cache of a busy box.
HOST_MARGIN = 512 * 1024**2
# On the CPU, new requests wait at most this long for the old server's last ones: two
# servers computing at once on the same cores are each several times slower (llama.cpp's
# threads poll for work by default, `--poll 50`: they spin while the other's run), so the
# old requests finish far sooner alone. A request longer than that (a long generation) is
# not waited for: the new server serves.
CPU_HOLD = 30.0


class Owner(Protocol):
    """What of the owner (owner.TargetSupervisor) a handover reads and sets."""

    name: str
    target: Target
    home: Backend  # the backend on the configured port
    backend: Backend  # the backend of the server that serves now
    launcher: Launcher
    events: EventBus
    http: aiohttp.ClientSession
    placer: Placer | None
    tuner: AutoTuner
    kit: dict[str, Any] | None  # what its ModelKit pulled (supervision/pulling.py)
    requests: ProxyRequests
    records: RunRecorder | None
    proxied: bool
    process: RunningProcess | None
    started_at: float | None
    failure_output: str | None
    metrics: Any
    runtime: dict[str, str]
    placement: dict[str, Any]
    retiring: dict[RunningProcess, asyncio.Task[None]]
    changes: StateChanges  # woken when the route moves too (a request may wait for it)
    pending_reason: str
    pairing: Callable[[list[str]], None]


def in_place_reason(replace: str, beside_trait: bool, launcher: str,
                    proxied: bool) -> str | None:
    """Why a planned restart happens in place before any memory is looked at; None: it may
    start the new server beside the old one."""
    if replace == "in_place":
        return "restart.replace is in_place"
    if not beside_trait:
        return f"the {launcher!r} launcher runs one server per target at a time"
    if replace == "auto" and not proxied:
        return ("the proxy is off, so clients reach the runtime on its own port "
                "(restart.replace: auto)")
    return None


def _why_in_place(owner: Owner) -> str | None:
    return in_place_reason(owner.target.restart.replace, owner.launcher.traits.beside,
                           owner.target.launcher, owner.proxied)


def may_go_beside(owner: Owner) -> bool:
    """Whether a planned restart of this target may start the new server beside the old one,
    memory permitting (the tuner then applies its decisions without waiting for idleness)."""
    return _why_in_place(owner) is None


def host_room(need: int | None, available: int) -> tuple[bool, str]:
    """Whether a second server fits in host memory beside the first."""
    if need is None:
        return False, "no memory estimate for this model, so a second server may not fit"
    text = (f"a second server needs about {gib(need)} of host memory, {gib(available)} is "
            f"available (keeping {gib(HOST_MARGIN)})")
    return need + HOST_MARGIN <= available, text


def next_port(current: int, home: int, is_free: Callable[[int], bool],
              spare: Callable[[], int]) -> int:
    """The configured port when the running server is elsewhere and it is free again, else
    a free one: after two such restarts the runtime is back where the fleet file says."""
    if current != home and is_free(home):
        return home
    return spare()


def _bind(host: str, port: int) -> int | None:
    """Bind `port` (0: any) on the target's address and let go: the port bound, or None
    when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0" if host in ("", "*") else host, port))
        except OSError:
            return None
        return int(s.getsockname()[1])


def at_port(backend: Backend, port: int) -> Backend:
    """`backend` for the same target listening on `port`."""
    if port == backend.target.port:
        return backend
    return backend.with_target(backend.target.model_copy(update={"port": port}))


def port_beside(home: Backend) -> Backend:
    """`home` where its configured port is free, else the same backend on a free port: the
    first server of a target whose old definition still serves there (a reload)."""
    host, port = home.target.host, home.target.port
    if _bind(host, port) is not None:
        return home
    return at_port(home, _bind(host, 0) or 0)


def holds_new_requests(owner: Owner, in_flight: int) -> bool:
    """Whether new requests wait for the old server's `in_flight` ones and the tuner takes no
    evidence meanwhile: both servers would compute on the same CPU cores."""
    return bool(in_flight) and not on_gpu(owner)


def held_words(held: bool) -> str:
    """What the `switched` event adds when new requests are held."""
    return (f"; new requests wait for them (at most {CPU_HOLD:g}s): both servers compute on "
            "the same CPU cores" if held else "")


def on_gpu(owner: Owner) -> bool:
    """Whether the VRAM plan puts this target on a GPU (else it computes on the host's cores)."""
    plan = owner.placer.fleet_plan if owner.placer is not None else None
    return bool(plan is not None and plan.on_gpu.get(owner.name))


async def room_beside(owner: Owner) -> tuple[bool, str]:
    """Whether memory holds a second server of this target while the first runs."""
    placer, name = owner.placer, owner.name
    if placer is not None and on_gpu(owner):
        fits, why = await placer.fits_now(name)  # NVML's free memory: the old one is in use
        if fits:
            return True, "a second copy fits in GPU memory beside the first"
        return False, (f"a second copy does not fit in GPU memory: {why}" if fits is False
                       else f"cannot tell whether a second copy fits in GPU memory ({why})")
    try:
        estimate = await asyncio.to_thread(owner.backend.memory_estimate, False)
    except SpecfleetError:
        estimate = None
    return host_room(estimate.total if estimate else None, psutil.virtual_memory().available)


def _emit(owner: Owner, reason: str, **data: Any) -> None:
    owner.events.emit(Event(owner.name, "replace", reason, data=data))


async def replace_beside(owner: Owner, old: RunningProcess, request: Request,
                         next_command: Callable[[], Awaitable[Request]]
                         ) -> RunningProcess | Request | None:
    """The new server, serving; a command that came while it loaded (the new server is gone,
    the command is the owner's to handle); or None: restart in place (the event says why)."""
    why = _why_in_place(owner)
    if why is None:
        fits, detail = await room_beside(owner)
        why = None if fits else detail
    if why is not None:
        _emit(owner, f"restarting in place: {why}", replace="in_place")
        return None
    host = owner.target.host
    port = next_port(owner.backend.target.port, owner.home.target.port,
                     lambda p: _bind(host, p) is not None, lambda: _bind(host, 0) or 0)
    moved = at_port(owner.home, port)
    try:
        plan = await plan_start(owner.name, moved, owner.launcher, owner.placer, owner.tuner,
                                owner.pairing)
        new = await owner.launcher.start(owner.name, plan.spec,
                                         stop_grace=owner.target.restart.stop_grace,
                                         on_line=moved.on_output)
    except (StartRefused, SpecfleetError, OSError) as exc:
        if owner.placer is not None:
            owner.placer.released(owner.name)
        _emit(owner, f"could not start a new server beside the old one ({exc}); restarting "
              "in place", replace="in_place")
        return None
    _emit(owner, f"pid {new.pid} starting on port {port} beside pid {old.pid}, which serves "
          f"meanwhile ({request.reason}; {detail})", replace="beside", pid=new.pid, port=port)
    began = time.monotonic()
    outcome = await _until_ready(owner, moved, new, next_command)
    if owner.placer is not None:
        owner.placer.released(owner.name)
    if outcome is not None:
        new.kill()
        await new.wait()
        if isinstance(outcome, Request):
            _emit(owner, f"the new server (pid {new.pid}) was stopped while it loaded: "
                  f"{outcome.reason}", replace="abandoned")
            return outcome
        _emit(owner, f"the new server (pid {new.pid}) {outcome}; restarting in place",
              replace="in_place", output=new.output_tail())
        return None
    _take_over(owner, old, new, moved, plan, time.monotonic() - began)
    return new


async def _until_ready(owner: Owner, backend: Backend, new: RunningProcess,
                       next_command: Callable[[], Awaitable[Request]]) -> str | Request | None:
    """None once the new server's health check passes; else why not, or the command that
    came first."""
    ready = asyncio.create_task(until_ready(lambda: backend.probe(owner.http),
                                            owner.target.health, lambda: new.returncode))
    command = asyncio.create_task(next_command())
    try:
        done, _ = await asyncio.wait({ready, command}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ready, command):
            if not task.done():
                task.cancel()  # a queue's get cancelled takes nothing from it
    return command.result() if command in done else ready.result()


def _take_over(owner: Owner, old: RunningProcess, new: RunningProcess, backend: Backend,
               plan: StartPlan, loaded_in: float) -> None:
    """The switch, with no await in it: from here the proxy sends new requests to the new
    server, and the owner supervises it."""
    old_route = owner.requests.switch_route()
    owner.backend = backend
    owner.process, owner.started_at, owner.failure_output = new, time.time(), None
    owner.metrics = None  # the old server's counters are not this one's
    owner.runtime = plan.runtime
    owner.placement = follow(new, backend, plan.placement)
    record_launch(owner, new, plan.spec)
    owner.changes.wake()
    owner.tuner.restarted(loaded_in, beside=True)  # what a switch costs (holding.py)
    left = owner.requests.on_route(old_route)
    held = holds_new_requests(owner, left)
    if held:
        owner.requests.hold_new(old_route, CPU_HOLD)
        owner.tuner.sharing_cores = True  # until the old one stops: _retire
    _emit(owner, f"pid {new.pid} on port {backend.target.port} serves now (ready after "
          f"{loaded_in:.1f}s); pid {old.pid} finishes its {left} request(s) in flight, then "
          "stops" + held_words(held),
          replace="switched", pid=new.pid, old_pid=old.pid, in_flight=left, held=held,
          loaded_s=round(loaded_in, 2))
    owner.retiring[old] = asyncio.create_task(_retire(owner, old, old_route),
                                              name=f"retire:{owner.name}:{old.pid}")


async def _retire(owner: Owner, old: RunningProcess, route: int) -> None:
    try:
        drained = await owner.requests.route_drained(route, owner.target.health.start_timeout)
        await old.stop(owner.target.restart.stop_grace)
        _emit(owner, f"pid {old.pid} stopped" + (
            " after its last request" if drained else
            f": its requests were still running after {owner.target.health.start_timeout:g}s"),
              replace="retired", pid=old.pid, drained=drained)
    finally:
        owner.retiring.pop(old, None)
        if not owner.retiring:
            owner.tuner.sharing_cores = False


async def stop_retiring(owner: Owner) -> None:
    """The owner ends: old servers still finishing their requests go with it."""
    for proc, task in list(owner.retiring.items()):
        task.cancel()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    owner.retiring.clear()


def record_launch(owner: Owner, proc: RunningProcess, spec: LaunchSpec) -> None:
    """The run record of a server that was started (in place or beside)."""
    if owner.records is None:
        return
    tuner = owner.tuner
    spec_view = {"method": owner.target.speculation.method, "variant": tuner.variant,
                 "enabled": tuner.speculation_on, "draft_length": tuner.draft_length}
    owner.records.launched(owner.name, proc.pid, owner.pending_reason, spec, owner.runtime,
                           owner.target.launcher, spec_view, owner.placement,
                           owner.backend.model_files(), owner.kit)
