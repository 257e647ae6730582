"""The daemon's HTTP API (aiohttp), for routers, dashboards and `specfleet status`.

GET /healthz answers for the daemon itself and never touches a model (LiteLLM-style
health checks that run a completion per model would load models). With a token
configured, everything else needs `Authorization: Bearer <token>` or a status-page
session (auth.py). The status page itself is ui.py. Malformed requests get a 4xx with a
JSON body `{"error": ...}`; nothing a client sends yields a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from supervisor import __version__
from supervisor.api.auth import KEY, Sessions, api_scope, auth_middleware
from supervisor.api.common import errors_as_json, named_target, serve
from supervisor.api.fleetview import FleetView
from supervisor.api.keys import OPEN, Holder
from supervisor.api.promexport import registry_for
from supervisor.api.ui import FAVICON, LOGIN, StatusPages
from supervisor.events import Event

OPEN_PATHS = {"/healthz", LOGIN, "/ui/logout", FAVICON}  # a logout and the tab icon need none
PAGES = ("/", "/ui")  # sent to the login page, not answered 401


class ApiServer:
    def __init__(self, fleet: FleetView) -> None:
        self.fleet = fleet
        self._runner: web.AppRunner | None = None
        self.sessions = Sessions()
        self.app = web.Application(middlewares=[
            errors_as_json, auth_middleware(fleet.keyring(), OPEN_PATHS, api_scope,
                                            self.sessions, PAGES, LOGIN)])
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/v1/targets", self.targets)
        self.app.router.add_get("/v1/targets/{name}", self.target)
        self.app.router.add_post("/v1/targets/{name}/restart", self.restart)
        self.app.router.add_post("/v1/reload", self.reload)
        self.app.router.add_get("/v1/events", self.events)
        self.app.router.add_get("/v1/litellm", self.litellm)
        self.app.router.add_get("/metrics", self.metrics)
        StatusPages(fleet, self.sessions).add_routes(self.app)
        self._metrics = registry_for(fleet)

    async def start(self, address: str, sock: socket.socket | None = None) -> None:
        self._runner = await serve(self.app, address, sock)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- handlers ---

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response(self.fleet.daemon_info())

    async def targets(self, request: web.Request) -> web.Response:
        return web.json_response({"daemon": self.fleet.daemon_info(),
                                  "targets": self.fleet.target_statuses()})

    async def target(self, request: web.Request) -> web.Response:
        name = named_target(self.fleet, request.match_info["name"]).name
        return web.json_response(self.fleet.target_statuses([name])[0])

    async def restart(self, request: web.Request) -> web.Response:
        target = named_target(self.fleet, request.match_info["name"])
        target.restart("restart requested through the API" + _with_key(request))
        return web.json_response({"target": target.name, "restarting": True}, status=202)

    async def reload(self, request: web.Request) -> web.Response:
        key: Holder = request[KEY]
        ok, problems = await self.fleet.reload(None if key is OPEN else key.name)
        if not ok:
            return web.json_response({"reloaded": False, "problems": problems}, status=422)
        return web.json_response({"reloaded": True})

    async def litellm(self, request: web.Request) -> web.Response:
        return web.json_response(self.fleet.litellm_config())

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._metrics)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: every state change and tuning decision, as it happens."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=1000)

        def push(event: Event) -> None:
            if not queue.full():  # a slow client loses events, never the daemon's memory
                queue.put_nowait(event)

        unsubscribe = self.fleet.subscribe(push)
        try:
            # A client may be gone before the headers go out: that is normal, not an error.
            await response.prepare(request)
            await response.write(f": specfleet {__version__} events\n\n".encode())
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=15)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                payload = json.dumps(event.to_dict())
                await response.write(f"event: {event.kind}\ndata: {payload}\n\n".encode())
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
            pass
        finally:
            unsubscribe()
        return response



def _with_key(request: web.Request) -> str:
    """Who asked, for the event of what it did: the key's name, never the key."""
    key: Holder = request.get(KEY, OPEN)
    return "" if key is OPEN else f" (key {key.name!r})"
