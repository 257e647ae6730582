"""The OCI distribution API, the part a pull needs (docs/modelkit-formats.md §5): a manifest
by tag or digest (verified: its sha256 is the digest asked for, and the one the registry
says in Docker-Content-Digest), blobs streamed, token and basic auth.

Written over aiohttp (the daemon's HTTP library already) rather than `oras` from PyPI: oras
brings `requests` and `jsonschema`, is synchronous, and verifies no digest (its download
loop hashes nothing), which is the part that matters here; what is left is three requests
and the auth challenge.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator

import aiohttp

from supervisor.config.ociref import Reference
from supervisor.errors import SpecfleetError
from supervisor.registry.artifact import ACCEPT
from supervisor.registry.credentials import Credentials

CHUNK = 1 << 20
MAX_MANIFEST = 4 << 20  # the spec's "at least 4 megabytes"


class RegistryError(SpecfleetError):
    pass


# What a registry that drops the connection, stalls or answers nonsense raises below the
# status line (a reset mid-body, a read timeout, a token that is not JSON): each becomes a
# RegistryError, which a pull retries and the cache may answer for.
_WIRE = (aiohttp.ClientError, TimeoutError, ValueError)


class NotFound(RegistryError):
    """The registry answered that what was asked for is not there (404)."""


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


class RegistryClient:
    def __init__(self, session: aiohttp.ClientSession, credentials: Credentials | None,
                 timeout: float = 30.0) -> None:
        self.session = session
        self.credentials = credentials
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self._auth: dict[str, str] = {}

    async def _get(self, ref: Reference, url: str, headers: dict[str, str],
                   method: str = "GET") -> aiohttp.ClientResponse:
        """A request with the auth the registry asks for (one retry after its challenge)."""
        for attempt in range(2):
            try:
                resp = await self.session.request(method, url, headers={**headers, **self._auth},
                                                  timeout=self.timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise RegistryError(f"registry {ref.host} cannot be reached: {exc!r}") from exc
            if resp.status != 401 or attempt == 1:
                return resp
            challenge = resp.headers.get("WWW-Authenticate", "")
            resp.release()
            await self._authenticate(ref, challenge)
        raise AssertionError("unreachable")

    async def _authenticate(self, ref: Reference, challenge: str) -> None:
        try:
            await self._authenticate_once(ref, challenge)
        except _WIRE as exc:
            raise RegistryError(f"registry {ref.host}: its token service failed: "
                                f"{exc!r}") from exc

    async def _authenticate_once(self, ref: Reference, challenge: str) -> None:
        scheme, params = _challenge(challenge)
        creds = self.credentials
        basic = aiohttp.BasicAuth(creds.username, creds.secret) if creds and \
            creds.username != "<token>" else None
        if scheme == "basic" and basic is not None:
            self._auth = {"Authorization": basic.encode()}
            return
        if scheme != "bearer" or "realm" not in params:
            raise RegistryError(f"registry {ref.host} refused: 401 ({challenge or 'no challenge'})"
                                + ("" if creds else "; no credentials found for it (docker "
                                   "login / podman login)"))
        query = {"service": params.get("service", ""),
                 "scope": params.get("scope", f"repository:{ref.repository}:pull")}
        async with self.session.get(params["realm"], params=query, auth=basic,
                                    timeout=self.timeout) as resp:
            if resp.status != 200:
                raise RegistryError(f"registry {ref.host}: its token service answered "
                                    f"{resp.status}")
            body = await resp.json(content_type=None)
        token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) \
            else None
        if not token:
            raise RegistryError(f"registry {ref.host}: its token service gave no token")
        self._auth = {"Authorization": f"Bearer {token}"}

    async def manifest(self, ref: Reference) -> tuple[str, bytes]:
        """(digest, bytes) of the manifest `ref` names, verified."""
        resp = await self._get(ref, f"{ref.base_url}/manifests/{ref.version}", {"Accept": ACCEPT})
        try:
            async with resp:
                if resp.status == 404:
                    raise NotFound(f"{ref}: no such manifest in {ref.host} "
                                   f"({(await resp.text(errors='replace'))[:200]})")
                if resp.status != 200:
                    raise RegistryError(f"{ref}: registry answered {resp.status} "
                                        f"({(await resp.text(errors='replace'))[:200]})")
                raw = await resp.content.read(MAX_MANIFEST + 1)
                said = resp.headers.get("Docker-Content-Digest")
        except _WIRE as exc:
            raise RegistryError(f"{ref}: the manifest could not be read from {ref.host}: "
                                f"{exc!r}") from exc
        if len(raw) > MAX_MANIFEST:
            raise RegistryError(f"{ref}: the manifest is larger than {MAX_MANIFEST} bytes")
        digest = f"sha256:{hashlib.sha256(raw).hexdigest()}"
        for expected, who in ((ref.digest, "the reference"), (said, "the registry")):
            if expected and expected != digest:
                raise RegistryError(f"{ref}: the manifest has digest {digest}, {who} says "
                                    f"{expected}; refused")
        return digest, raw

    async def blob(self, ref: Reference, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes as they come (the store verifies them)."""
        resp = await self._get(ref, f"{ref.base_url}/blobs/{digest}", {})
        try:
            async with resp:
                if resp.status != 200:
                    raise RegistryError(f"{ref}: blob {digest}: registry answered "
                                        f"{resp.status}")
                async for chunk in resp.content.iter_chunked(CHUNK):
                    yield chunk
        except _WIRE as exc:
            raise RegistryError(f"{ref}: blob {digest} was cut off by {ref.host}: "
                                f"{exc!r}") from exc
