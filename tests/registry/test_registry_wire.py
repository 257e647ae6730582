"""A registry that misbehaves below the status line, on a real socket: a blob cut off
mid-body and a manifest that is not a JSON object come out as specfleet's errors (which a
pull retries, the cache may answer for, `check` prints without a traceback), never as
aiohttp's or json's exceptions, which would end a target as an internal error or a reload
as a crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from supervisor.config import ociref
from supervisor.errors import SpecfleetError
from supervisor.registry.client import RegistryClient, RegistryError
from supervisor.registry.modelkits import ModelKits
from supervisor.registry.store import LayerStore

Serve = Callable[[bytes], Awaitable[str]]


@pytest.fixture
async def answering() -> AsyncIterator[Serve]:
    """A server on loopback that answers every request with the given raw bytes, then
    closes the connection; its host:port."""
    servers: list[asyncio.Server] = []

    async def serve(response: bytes) -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        servers.append(server)
        return f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield serve
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_a_blob_cut_off_mid_body_is_a_registry_error(answering):
    host = await answering(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    ref = ociref.parse(f"{host}/lab/m:v1")
    async with aiohttp.ClientSession() as session:
        client = RegistryClient(session, None, timeout=5)
        with pytest.raises(RegistryError, match=r"blob sha256:0+ was cut off by 127\.0\.0\.1"):
            async for _ in client.blob(ref, "sha256:" + "0" * 64):
                pass


@pytest.mark.parametrize("body", [b"[1, 2]", b"<html>a login page</html>"])
async def test_a_manifest_that_is_not_a_json_object_is_refused_saying_so(
        answering, tmp_path: Path, body: bytes):
    host = await answering(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    async with aiohttp.ClientSession() as session:
        kits = ModelKits(LayerStore(tmp_path / "cache"), session, timeout=5)
        with pytest.raises(SpecfleetError, match="the manifest is not"):
            await kits.resolve(f"{host}/lab/m:v1")
