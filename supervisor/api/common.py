"""What the API and the proxy share: listening, JSON errors, finding a target by name."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

from supervisor.api.fleetview import FleetView, ServedTarget

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def serve(app: web.Application, address: str,
                sock: socket.socket | None = None) -> web.AppRunner:
    """Listen on HOST:PORT, or on `sock` (handed over by systemd: listening.py); the
    runner's cleanup() stops it."""
    host, _, port = address.rpartition(":")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock) if sock is not None else \
        web.TCPSite(runner, host.strip("[]"), int(port))
    await site.start()
    return runner


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            return json_error(exc.status, exc.reason)
        raise


def named_target(fleet: FleetView, name: str) -> ServedTarget:
    """The target called `name`, or a 404 that lists the targets."""
    target = fleet.served_target(name)
    if target is None:
        raise web.HTTPNotFound(reason=f"no target {name!r}; targets: "
                               f"{', '.join(fleet.target_names()) or '(none)'}")
    return target
