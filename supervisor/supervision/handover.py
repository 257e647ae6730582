"""A planned restart that costs no service: the new server starts beside the old one.

A retune, a restart through the API or a reload that changes a serving target would
otherwise stop the server and start it again: seconds to minutes with nothing served (a
model load). Here, as in a blue-green deploy, the owner's `Handover` part:

1. whether it may: `restart.replace`, the launcher's `beside` trait, the proxy (with `auto`),
   and room for both (the VRAM plan's live check on a GPU, host memory on the CPU); for a
   reload, also a serving old server and the same launcher (`reload_in_place_reason`);
2. the new server (of the same definition, or of the reload's new one) starts on another
   port and loads while the old one serves;
3. once its health check passes, the proxy's new requests go to it (the route changes:
   requests.py), and the owner supervises it (the owner's `serve`: the one place its
   server, and a reload's definition, are replaced);
4. the old one finishes the requests it has (up to the new `health.start_timeout`), then
   stops.
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

import aiohttp
import psutil

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError, StartRefused
from supervisor.gpu.placement import Placer
from supervisor.gpu.vram import gib
from supervisor.plugin.backend import Backend
from supervisor.plugin.launching import Launcher, RunningProcess
from supervisor.supervision.commands import Request
from supervisor.supervision.probes import until_ready
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.server import Definition, Server
from supervisor.supervision.start import launch
from supervisor.supervision.states import SERVING, State
from supervisor.tuning.autotuner import AutoTuner

# Host memory left over once both servers run: the daemon, the page cache of a busy box.
HOST_MARGIN = 512 * 1024**2
# On the CPU, new requests wait at most this long for the old server's last ones: two
# servers computing at once on the same cores are each several times slower (llama.cpp's
# threads poll for work by default, `--poll 50`: they spin while the other's run), so the
# old requests finish far sooner alone. A request longer than that (a long generation) is
# not waited for: the new server serves.
CPU_HOLD = 30.0


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


def may_go_beside(target: Target, launcher: Launcher, proxied: bool) -> bool:
    """Whether a planned restart of this target may start the new server beside the old one,
    memory permitting (the tuner then applies its decisions without waiting for idleness)."""
    return in_place_reason(target.restart.replace, launcher.traits.beside, target.launcher,
                           proxied) is None


def reload_in_place_reason(old: Target, old_state: State, new: Target, beside_trait: bool,
                           proxied: bool) -> str | None:
    """Why a reload that changes `old` into `new` restarts it in place; None: the new
    server may start beside the old one (memory permitting)."""
    if old_state not in SERVING:
        return f"it is {old_state.value}, so there is no service to keep"
    if old.launcher != new.launcher:
        return f"its launcher changes ({old.launcher} -> {new.launcher})"
    return in_place_reason(new.restart.replace, beside_trait, new.launcher, proxied)


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


def held_words(held: bool) -> str:
    """What the `switched` event adds when new requests are held."""
    return (f"; new requests wait for them (at most {CPU_HOLD:g}s): both servers compute on "
            "the same CPU cores" if held else "")


def on_gpu(placer: Placer | None, name: str) -> bool:
    """Whether the VRAM plan puts this target on a GPU (else it computes on the host's cores)."""
    plan = placer.fleet_plan if placer is not None else None
    return bool(plan is not None and plan.on_gpu.get(name))


async def room_beside(placer: Placer | None, backend: Backend) -> tuple[bool, str]:
    """Whether memory holds a second server of this target while the first runs."""
    name = backend.target.name
    if placer is not None and on_gpu(placer, name):
        fits, why = await placer.fits_now(name)  # NVML's free memory: the old one is in use
        if fits:
            return True, "a second copy fits in GPU memory beside the first"
        return False, (f"a second copy does not fit in GPU memory: {why}" if fits is False
                       else f"cannot tell whether a second copy fits in GPU memory ({why})")
    try:
        estimate = await asyncio.to_thread(backend.memory_estimate, False)
    except SpecfleetError:
        estimate = None
    return host_room(estimate.total if estimate else None, psutil.virtual_memory().available)


Serve = Callable[[Server, Definition], None]  # the owner takes the new server (and definition)


class Handover:
    """The owner's part that replaces its serving server by one started beside it; it holds
    the old servers still finishing their requests (`retiring`) and changes nothing of the
    owner's but through `serve`."""

    def __init__(self, name: str, http: aiohttp.ClientSession, requests: ProxyRequests,
                 placer: Placer | None, pairing: Callable[[list[str]], None],
                 emit: Callable[..., None]) -> None:
        self.name, self.http, self.requests = name, http, requests
        self.placer, self.pairing = placer, pairing
        self._emit = emit  # (reason, **data): a `replace` event of the target
        self.retiring: dict[RunningProcess, asyncio.Task[None]] = {}
        self._sharing: AutoTuner | None = None  # told that cores are shared until retired

    async def replace(self, old: Server, definition: Definition, reason: str,
                      why_in_place: str | None, next_command: Callable[[], Awaitable[Request]],
                      serve: Serve) -> bool | Request:
        """A server of `definition` started beside `old`; once ready, `serve` takes it and
        `old` retires: True. A command that came while it loaded: the new server is gone and
        the command is the owner's to handle. False: restart in place (the event says why)."""
        why = why_in_place
        if why is None:
            fits, detail = await room_beside(self.placer, definition.home)
            why = None if fits else detail
        if why is not None:
            self._emit(f"restarting in place: {why}", replace="in_place")
            return False
        host = definition.target.host
        port = next_port(old.backend.target.port, definition.home.target.port,
                         lambda p: _bind(host, p) is not None, lambda: _bind(host, 0) or 0)
        moved = at_port(definition.home, port)
        try:
            new, _ = await launch(self.name, moved, definition, self.placer, self.pairing)
        except (StartRefused, SpecfleetError, OSError) as exc:
            if self.placer is not None:
                self.placer.released(self.name)
            self._emit(f"could not start a new server beside the old one ({exc}); restarting "
                       "in place", replace="in_place")
            return False
        self._emit(f"pid {new.process.pid} starting on port {port} beside pid "
                   f"{old.process.pid}, which serves meanwhile ({reason}; {detail})",
                   replace="beside", pid=new.process.pid, port=port)
        began = time.monotonic()
        outcome = await self._until_ready(new, definition.target, next_command)
        if self.placer is not None:
            self.placer.released(self.name)
        if outcome is not None:
            new.process.kill()
            await new.process.wait()
            if isinstance(outcome, Request):
                self._emit(f"the new server (pid {new.process.pid}) was stopped while it "
                           f"loaded: {outcome.reason}", replace="abandoned")
                return outcome
            self._emit(f"the new server (pid {new.process.pid}) {outcome}; restarting in "
                       "place", replace="in_place", output=new.process.output_tail())
            return False
        self._switch(old, new, definition, time.monotonic() - began, serve)
        return True

    async def _until_ready(self, new: Server, target: Target,
                           next_command: Callable[[], Awaitable[Request]]) -> str | Request | None:
        """None once the new server's health check passes; else why not, or the command that
        came first."""
        ready = asyncio.create_task(until_ready(lambda: new.backend.probe(self.http),
                                                target.health, lambda: new.process.returncode))
        command = asyncio.create_task(next_command())
        try:
            done, _ = await asyncio.wait({ready, command}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, command):
                if not task.done():
                    task.cancel()  # a queue's get cancelled takes nothing from it
        return command.result() if command in done else ready.result()

    def _switch(self, old: Server, new: Server, definition: Definition, loaded_in: float,
                serve: Serve) -> None:
        """The switch, with no await in it: from here the proxy sends new requests to the new
        server, and the owner supervises it."""
        old_route = self.requests.switch_route()
        serve(new, definition)
        tuner = definition.tuner
        tuner.restarted(loaded_in, beside=True)  # what a switch costs (holding.py)
        left = self.requests.on_route(old_route)
        # Both servers would compute on the same CPU cores: new requests wait for the old
        # server's, and the tuner takes no evidence meanwhile.
        held = bool(left) and not on_gpu(self.placer, self.name)
        if held:
            self.requests.hold_new(old_route, CPU_HOLD)
            tuner.share_cores(True)  # until the old one stops: _retire
            self._sharing = tuner
        self._emit(f"pid {new.process.pid} on port {new.backend.target.port} serves now (ready "
                   f"after {loaded_in:.1f}s); pid {old.process.pid} finishes its {left} "
                   "request(s) in flight, then stops" + held_words(held),
                   replace="switched", pid=new.process.pid, old_pid=old.process.pid,
                   in_flight=left, held=held, loaded_s=round(loaded_in, 2))
        self.retiring[old.process] = asyncio.create_task(
            self._retire(old.process, old_route, definition.target),
            name=f"retire:{self.name}:{old.process.pid}")

    async def _retire(self, old: RunningProcess, route: int, target: Target) -> None:
        timeout = target.health.start_timeout
        try:
            drained = await self.requests.route_drained(route, timeout)
            await old.stop(target.restart.stop_grace)
            self._emit(f"pid {old.pid} stopped" + (
                " after its last request" if drained else
                f": its requests were still running after {timeout:g}s"),
                       replace="retired", pid=old.pid, drained=drained)
        finally:
            self.retiring.pop(old, None)
            if not self.retiring and self._sharing is not None:
                self._sharing.share_cores(False)
                self._sharing = None

    async def stop_all(self) -> None:
        """The owner ends: old servers still finishing their requests go with it."""
        for proc, task in list(self.retiring.items()):
            task.cancel()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        self.retiring.clear()
