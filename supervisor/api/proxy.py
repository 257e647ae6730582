"""OpenAI-compatible proxy in front of the fleet: /v1/models, /v1/chat/completions,
/v1/completions, routed by the request's `model` (a target name).

While a target restarts (a crash, a retune, an API restart) requests wait for it, up to
`daemon.proxy.hold`, instead of failing; a restart for a retune first waits for the
requests in flight to finish (the target supervisor drains them), so no client sees a
cut stream. Responses, streamed or not, are passed through byte for byte. The `timings`
llama.cpp returns with each completion (draft_n, draft_n_accepted) are counted per
target: the acceptance clients actually got.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

import aiohttp
from aiohttp import web

from supervisor.api.auth import KEY, auth_middleware, proxy_scope
from supervisor.api.common import errors_as_json, json_error, named_target, serve
from supervisor.api.fleetview import FleetView, ServedTarget
from supervisor.api.keys import OPEN, Holder
from supervisor.tuning.acceptance import CLASS_HEADER, request_class

# Hop-by-hop and length headers are the proxy's own business, not passed through.
_DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
         "server", "date"}


class Proxy:
    def __init__(self, fleet: FleetView, hold: float) -> None:
        self.fleet = fleet
        self.hold = hold  # daemon.proxy.hold
        self._runner: web.AppRunner | None = None
        self._under_way = 0  # requests being answered (waiting for a target, or relayed)
        self._idle = asyncio.Event()
        self._idle.set()
        self._fleet = asyncio.Event()  # the daemon's targets are known (expect_fleet)
        self._fleet.set()
        self._session: aiohttp.ClientSession | None = None
        self.app = web.Application(middlewares=[errors_as_json,
                                                auth_middleware(fleet.keyring(), set(),
                                                                proxy_scope)],
                                   client_max_size=64 * 1024 * 1024)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/chat/completions", self.forward)
        self.app.router.add_post("/v1/completions", self.forward)

    def expect_fleet(self) -> None:
        """Listening starts before the daemon has added its targets: until `fleet_added`,
        a request waits (within `hold`) instead of finding no target of its name. That
        matters where connections were waiting in systemd's socket across a restart."""
        self._fleet.clear()

    def fleet_added(self) -> None:
        self._fleet.set()

    async def _fleet_known(self) -> None:
        if not self._fleet.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fleet.wait(), self.hold)

    async def start(self, address: str, sock: socket.socket | None = None) -> None:
        # Connections to the runtimes are reused (saves ~0.3 ms per request): llama-server
        # b11434 serves requests beyond its n_parallel+4 fixed HTTP threads with dynamic
        # ones, so idle pooled connections do not starve it. Closed after 4 s idle, before
        # its own 5 s keep-alive timeout, so a reused connection is not one it just closed.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        self._runner = await serve(self.app, address, sock)

    async def drain(self, timeout: float) -> tuple[int, int]:
        """A planned stop: the listening sockets close (new connections are refused), then
        the requests under way get at most `timeout` seconds to finish. (under way at the
        start, still under way at the end)."""
        if self._runner is None:
            return 0, 0
        for site in list(self._runner.sites):
            await site.stop()
        before = self._under_way
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return before, self._under_way

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def models(self, request: web.Request) -> web.Response:
        await self._fleet_known()
        data = []
        key: Holder = request[KEY]
        for name in self.fleet.target_names():
            if key.may_use(name) and (target := self.fleet.served_target(name)) is not None:
                data.append({"id": name, "object": "model", "owned_by": "specfleet",
                             "created": int(target.since), "ready": target.serving})
        return web.json_response({"object": "list", "data": data})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        self._under_way += 1
        self._idle.clear()
        try:
            return await self._forward(request)
        finally:
            self._under_way -= 1
            if self._under_way == 0:
                self._idle.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            return json_error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return json_error(400, "the request needs a \"model\" (a target name)")
        await self._fleet_known()
        target = named_target(self.fleet, body["model"])
        key: Holder = request[KEY]
        if not key.may_use(target.name):  # listed in the activity, as who was refused
            covers = ", ".join(sorted(key.targets or ()))
            return self._failed(request, target, time.time(), body.get("stream") is True, 403,
                                f"key {key.name!r} may not use target {target.name!r}: its "
                                f"inference scope covers {covers}")
        upstream_model = target.upstream_model()
        if upstream_model is not None and upstream_model != body["model"]:
            body["model"] = upstream_model
            raw = json.dumps(body).encode()
        deadline = time.monotonic() + self.hold
        began = time.time()
        stream = body.get("stream") is True
        resent = False
        while True:
            if not await target.wait_serving(deadline - time.monotonic()):
                # A reload replaced the target meanwhile (its changed definition under the
                # same name): the request waits for that one instead, within `hold`.
                if (now := self.fleet.served_target(target.name)) not in (None, target) \
                        and deadline > time.monotonic():
                    target = now
                    continue
                return self._failed(request, target, began, stream, 503, self._unavailable(target))
            klass = request_class(body, request.path, request.headers.get(CLASS_HEADER))
            await target.arriving(klass, deadline - time.monotonic())
            if not target.serving:
                continue  # restarting in place for this request's class: wait for it
            try:
                async with target.relaying() as base_url:
                    response, final = await self._relay(request, target, raw, base_url, klass)
                self.fleet.record_request(target.name, response.status, began,
                                          time.time() - began, stream, final,
                                          key=_key_name(request))
                return response
            except _NotSent as exc:
                # Nothing reached the client yet. Refused connections (the target is
                # restarting) are retried until `hold`; a request the runtime received and
                # then dropped without an answer (it died) is resent once, no more.
                if exc.received:
                    if resent:
                        return self._failed(request, target, began, stream, 502,
                                            f"target {target.name!r} dropped the request "
                                            "without an answer twice (it was resent once)")
                    resent = True
                await asyncio.sleep(0.05)

    def _failed(self, request: web.Request, target: ServedTarget, began: float, stream: bool,
                status: int, message: str) -> web.Response:
        """A request answered by the proxy itself, listed in the activity too."""
        self.fleet.record_request(target.name, status, began, time.time() - began, stream,
                                  None, error=message, key=_key_name(request))
        return json_error(status, message)

    def _unavailable(self, target: ServedTarget) -> str:
        if self.fleet.served_target(target.name) is None:  # removed by a reload meanwhile
            return (f"target {target.name!r} was removed from the fleet file by a reload "
                    "while the request waited for it")
        if (why := target.unavailable_reason()) is not None:
            state = target.state_name()
            if state == "waiting":  # the reason says what for and when it looks again
                return f"target {target.name!r} is {why}"
            if state == "unloaded":  # a load that was refused is decided afresh each time
                return f"target {target.name!r} is {why}; the next request tries to load it again"
            return (f"target {target.name!r} is {why}; it will not come back by itself (POST "
                    f"/v1/targets/{target.name}/restart, or fix the fleet file and reload)")
        return (f"target {target.name!r} is {target.state_name()} and did not become ready "
                f"within {self.hold:g}s (daemon.proxy.hold)")

    async def _relay(self, request: web.Request, target: ServedTarget, raw: bytes,
                     base_url: str, klass: str
                     ) -> tuple[web.StreamResponse, dict[str, Any] | None]:
        """The runtime's response relayed to the client, and the object at its end that
        says what the request used (None: none, or the response was cut); what it made is
        counted for the tuner under the request's class `klass`."""
        assert self._session is not None
        headers = {"Content-Type": "application/json", **target.auth_headers()}
        if accept := request.headers.get("Accept"):
            headers["Accept"] = accept
        url = f"{base_url}{request.path}"
        try:
            upstream = await self._session.post(url, data=raw, headers=headers)
        except aiohttp.ClientConnectorError as exc:
            raise _NotSent(received=False) from exc  # nothing listens (yet)
        except aiohttp.ClientConnectionError as exc:
            raise _NotSent(received=True) from exc  # sent, then dropped without an answer
        async with upstream:
            if upstream.status == 503 and not target.serving:
                raise _NotSent(received=False)  # loading again: wait and resend
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _DROP:
                    response.headers[key] = value
            await response.prepare(request)
            tail = b""
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    tail = (tail + chunk)[-16384:]  # the last event carries the timings
            except aiohttp.ClientError:
                # The runtime died mid-response: part of it reached the client, so it cannot
                # be resent. Close the client's connection so it sees a cut response, not a
                # complete one.
                if request.transport is not None:
                    request.transport.close()
                return response, None
            # A client may close as soon as it has the last event (`data: [DONE]`), before
            # the chunked body's end: it has the whole response, which counts. (aiohttp's
            # ClientConnectionResetError is a ConnectionResetError.)
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        final = _final_object(tail)
        if final is not None:
            target.observe_final(final, klass)
        return response, final


class _NotSent(Exception):
    """Nothing was relayed to the client: the request may be sent again. `received`: the
    runtime may have received it (and died before answering)."""

    def __init__(self, received: bool) -> None:
        super().__init__()
        self.received = received


def _final_object(tail: bytes) -> dict[str, Any] | None:
    """The object at the end of a response that carries llama.cpp's `timings` or the
    OpenAI `usage`: the JSON body, or a stream's last `data:` event that has them."""
    if b'"timings"' not in tail and b'"usage"' not in tail:
        return None
    text = tail.decode(errors="replace")
    start = max(text.rfind('"timings"'), text.rfind('"usage"'))
    # Streamed: the last `data: {...}` event holding it; plain: the JSON body.
    begin = text.rfind("data: ", 0, start)
    candidate = text[begin + 6:] if begin >= 0 else text
    candidate = candidate.split("\n\n", 1)[0].strip()
    try:
        data: Any = json.loads(candidate)
    except ValueError:
        try:
            data = json.loads(text)
        except ValueError:
            return None
    return data if isinstance(data, dict) else None


def _key_name(request: web.Request) -> str | None:
    """The name of the key the request came with, for the request log; None without keys."""
    key: Holder = request.get(KEY, OPEN)
    return None if key is OPEN else key.name
