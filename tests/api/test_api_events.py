"""GET /v1/events (server-sent events) when clients come and go: a client that disconnects is
normal and leaves no traceback in the daemon's log."""

from __future__ import annotations

import asyncio
import logging

from aiohttp.test_utils import TestServer

from supervisor.api.server import ApiServer
from supervisor.events import Event, EventBus
from tests.tuning.test_shown_quantities import OneTargetFleet


class NoTargets(OneTargetFleet):
    def __init__(self, bus: EventBus) -> None:
        self.bus, self.fleet_file = bus, "fleet.yaml"

    def target_statuses(self, names=None):  # type: ignore[no-untyped-def]
        return []

    def target_names(self) -> list[str]:
        return []


async def test_clients_that_disconnect_from_the_event_stream_leave_no_traceback(caplog):
    bus = EventBus()
    server = TestServer(ApiServer(NoTargets(bus)).app)
    await server.start_server()
    caplog.set_level(logging.DEBUG)
    try:
        for n in range(60):
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            if n % 3:  # some read the first bytes, some leave at once
                await reader.read(64)
            if n % 3 == 2:
                bus.emit(Event("-", "daemon", "something happened"))
            writer.transport.abort()  # a reset, as a killed client leaves it
        for _ in range(3):  # let the server see the resets and write to the dead sockets
            bus.emit(Event("-", "daemon", "after the clients left"))
            await asyncio.sleep(0.05)
    finally:
        await server.close()
    tracebacks = [r for r in caplog.records if r.exc_info or "Error handling request" in r.message]
    assert tracebacks == []
