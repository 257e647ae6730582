"""A target's model and draft from a ModelKit: resolve the reference, pull what is missing,
and the target as it runs (docs/modelkits.md).

- `resolve`: the manifest the reference names now, and the Kitfile (the config blob), both
  verified by digest and kept in the cache. While the registry cannot be reached, the
  digest the tag last resolved to, from the cache, with the registry's error kept in
  `offline`; nothing cached then is a RegistryError that says both.
- `pull`: only the layers the target runs (the model, and the draft part where speculation
  takes a draft file; never code, datasets or docs), each verified while it streams
  (store.put) and skipped when cached. The tag is remembered once all are in, so a start
  from the cache always finds every layer.
- `materialized`: the target with `model` and `speculation.draft` at their files in the
  cache (paths named by digest: a moved tag is another path, so another model to the
  tuner and the run records).
- `provenance`: what a run record keeps beside the files' sha256.
- `verify`: the manifest's cosign signatures judged by the target's trust policy
  (signatures.py) before any layer is used; the signatures are kept in the cache, so that
  a start from the cache while the registry is down is judged the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.config import ociref
from supervisor.config.schema import (
    METHODS_NEEDING_DRAFT,
    METHODS_WITH_DRAFT_FILE,
    ModelKit,
    Target,
)
from supervisor.errors import Untrusted
from supervisor.registry import artifact, credentials
from supervisor.registry.artifact import Artifact, Layer
from supervisor.registry.client import NotFound, RegistryClient, RegistryError
from supervisor.registry.signatures import (
    MAX_PAYLOAD,
    Signed,
    Verdict,
    judge,
    load_keys,
    payload_ok,
    signature_layers,
    signature_tag,
)
from supervisor.registry.store import LayerStore, TamperedBlob

# (bytes so far, bytes in all) over every layer a pull fetches.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Resolved:
    ref: ociref.Reference
    digest: str  # the manifest's
    artifact: Artifact
    offline: str | None = None  # the registry's error, when resolved from the cache

    def layers(self, target: Target) -> dict[str, Layer]:
        """The layers `target` runs, by role: the model; the draft where the method takes a
        draft file that the fleet file does not name (for `mtp`, only a named part: its
        head is usually inside the model)."""
        out = {"model": self.artifact.model()}
        spec, part = target.speculation, target.modelkit.draft if target.modelkit else None
        if spec.method in METHODS_WITH_DRAFT_FILE and not spec.draft and (
                part or spec.method in METHODS_NEEDING_DRAFT):
            out["draft"] = self.artifact.draft(part)
        return out

    def provenance(self, layers: dict[str, Layer]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "reference": str(self.ref), "manifest_digest": self.digest,
            "format": self.artifact.format, "package": self.artifact.package,
            "layers": {role: layer.digest for role, layer in layers.items()}}
        if self.offline:
            out["offline"] = self.offline
        return out


def materialized(target: Target, store: LayerStore, layers: dict[str, Layer]) -> Target:
    """`target` with its model (and draft) at their places in the cache."""
    update: dict[str, Any] = {"model": str(store.place_of(layers["model"]))}
    if "draft" in layers:
        update["speculation"] = target.speculation.model_copy(
            update={"draft": str(store.place_of(layers["draft"]))})
    return target.model_copy(update=update)


class ModelKits:
    """The daemon's (or `specfleet pull`'s) way to registries, over one aiohttp session."""

    def __init__(self, store: LayerStore, session: aiohttp.ClientSession,
                 timeout: float = 30.0, max_size: int | None = None,
                 in_use: Callable[[], Iterable[str]] = tuple, keep: bool = True,
                 keys: Mapping[str, str] | None = None, verify: str = "off") -> None:
        self.store = store
        self.keys = dict(keys or {})  # daemon.modelkits.keys: name -> PEM file
        self.policy = verify  # daemon.modelkits.verify: a target's default
        self.keep = keep  # keep manifests in the cache (False: `check`, which writes nothing)
        self.session = session
        self.timeout = timeout
        self.max_size = max_size  # of the cache, pruned after each pull (None: never)
        self.in_use = in_use  # digests of layers that run: never pruned
        self._clients: dict[str, RegistryClient] = {}

    def _client(self, host: str) -> RegistryClient:
        if host not in self._clients:  # one per registry: it keeps that registry's token
            self._clients[host] = RegistryClient(self.session, credentials.lookup(host),
                                                 self.timeout)
        return self._clients[host]

    async def resolve(self, text: str) -> Resolved:
        ref = ociref.parse(text)
        try:
            digest, raw = await self._client(ref.host).manifest(ref)
            config = await self._config(ref, raw)
        except RegistryError as exc:
            return self._from_cache(ref, str(exc))
        if self.keep:
            self.store.put_json(digest, raw)
        return Resolved(ref, digest, artifact.read(raw, config))

    async def _config(self, ref: ociref.Reference, raw: bytes) -> bytes | None:
        manifest = artifact.parse_json(raw, "manifest")
        desc = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
        digest = desc.get("digest")
        if not digest or artifact.manifest_format(manifest) != "kit":
            return None  # a ModelPack's config is not needed (the Kitfile is an annotation)
        if (cached := self.store.get_json(digest)) is not None:
            return cached
        body = b"".join([c async for c in self._client(ref.host).blob(ref, digest)])
        if f"sha256:{hashlib.sha256(body).hexdigest()}" != digest:
            raise TamperedBlob(f"{ref}: its Kitfile (config blob) is not {digest}; refused")
        if self.keep:
            self.store.put_json(digest, body)
        return body

    def _from_cache(self, ref: ociref.Reference, error: str) -> Resolved:
        digest = self.store.last_digest(ref)
        raw = self.store.get_json(digest) if digest else None
        if digest is None or raw is None:
            raise RegistryError(f"{error}; and {ref} was never pulled here, so there is "
                                "nothing cached to start from")
        desc = json.loads(raw).get("config") or {}
        config = self.store.get_json(desc["digest"]) if desc.get("digest") else None
        return Resolved(ref, digest, artifact.read(raw, config), offline=error)

    def trust_of(self, kit: ModelKit) -> tuple[str, dict[str, str]]:
        """A target's policy and the keys it trusts (the daemon's and its own)."""
        return kit.verify or self.policy, {**self.keys, **kit.keys}

    async def verify(self, resolved: Resolved, policy: str,
                     keys: Mapping[str, str]) -> Verdict:
        """The policy's verdict on the resolved manifest: Untrusted where it refuses."""
        if policy == "off":
            return Verdict(policy)
        trusted = load_keys(keys)
        where = replace(resolved.ref, tag=signature_tag(resolved.digest), digest=None)
        signed = await self._signatures(where, resolved.offline)
        return judge(policy, resolved.ref, resolved.digest, signed, trusted)

    async def _signatures(self, where: ociref.Reference, offline: str | None) -> list[Signed]:
        """The signature layers at cosign's tag, from the registry (kept in the cache), or
        from the cache while the registry cannot be reached."""
        if offline is None:
            try:
                digest, raw = await self._client(where.host).manifest(where)
            except NotFound:
                return []
            except RegistryError as exc:
                raise Untrusted(f"{where}: its signatures could not be read: {exc}") from None
            signed = [Signed(await self._payload(where, d), sig)
                      for d, sig in signature_layers(raw)]
            if self.keep:
                self.store.put_json(digest, raw)
                for s in signed:
                    self.store.put_json(f"sha256:{hashlib.sha256(s.payload).hexdigest()}",
                                        s.payload)
                self.store.remember_tag(where, digest)
            return signed
        kept = self.store.last_digest(where)
        raw = self.store.get_json(kept) if kept else None
        if raw is None:
            return []
        return [Signed(payload, sig) for d, sig in signature_layers(raw)
                if (payload := self.store.get_json(d)) is not None]

    async def _payload(self, where: ociref.Reference, digest: str) -> bytes:
        body = b""
        async for chunk in self._client(where.host).blob(where, digest):
            body += chunk
            if len(body) > MAX_PAYLOAD:
                raise Untrusted(f"{where}: signature payload {digest} is too large")
        if not payload_ok(body, digest):
            raise Untrusted(f"{where}: signature payload is not {digest}; refused")
        return body

    async def pull(self, resolved: Resolved, layers: dict[str, Layer],
                   progress: Progress | None = None) -> dict[str, Path]:
        """Each layer's file in the cache, fetched where missing (verified on the way)."""
        missing = [x for x in layers.values() if self.store.path_of(x) is None]
        if missing and resolved.offline:
            raise RegistryError(f"{resolved.offline}; and {resolved.ref} ({resolved.digest}) "
                                f"is cached without {', '.join(x.path for x in missing)}")
        total, done = sum(x.size for x in missing), 0
        pinned = resolved.ref.pinned(resolved.digest)  # what was resolved, even if the tag moves
        for layer in missing:
            def step(got: int, _: int, before: int = done) -> None:
                if progress is not None:
                    progress(before + got, total)
            await self.store.put(layer, self._client(pinned.host).blob(pinned, layer.digest),
                                 step)
            done += layer.size
        if not resolved.ref.digest and not resolved.offline:
            self.store.remember_tag(resolved.ref, resolved.digest)
        if missing and self.max_size is not None:
            self.store.prune(self.max_size, [*self.in_use(), *(x.digest for x in layers.values())])
        paths = {role: self.store.path_of(x) for role, x in layers.items()}
        return {role: p for role, p in paths.items() if p is not None}
