"""A target whose model comes from a ModelKit (`modelkit:`): pulled before its first start.

The owner (owner.py) calls its definition's `KitPuller.pull_or_command` before each start;
it acts once per definition, before the first: the reference is resolved (the registry; its
cache while the registry is down), the model and draft layers are pulled where missing, and
the owner runs the target with
`model` and `speculation.draft` at their files in the cache (registry/modelkits.py). The
target stays `starting` meanwhile (no process runs yet), the pull's progress in its live
status (the API's `modelkit.pull`; not in status.json, which would be rewritten at every
chunk). Events of kind `modelkit` say what was resolved and pulled. A registry that cannot
be reached with nothing cached is waited for (`waiting`, `unreachable`: the start is tried
again with backoff, waiting.py); a tampered layer or an artifact without the layers the
target needs fails the start for good, saying why. A tag that moved is seen at the next
daemon start or reload (daemon/fleet.py): the owner gets a new definition, which pulls the
new digest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from supervisor.config.schema import Target
from supervisor.errors import NotReachableYet
from supervisor.registry.client import RegistryError
from supervisor.registry.modelkits import ModelKits, materialized
from supervisor.supervision.commands import Command, Next, Phase, Request, next_step


class KitPuller:
    """A definition's ModelKit (server.Definition.puller): resolved and pulled once, before
    its first start; `kit` is what was pulled (provenance) and the pull under way."""

    def __init__(self, name: str, kits: ModelKits | None,
                 emit: Callable[..., None]) -> None:
        self.name = name
        self.kits = kits
        self._emit = emit  # (reason, **data): a `modelkit` event of the target
        self.kit: dict[str, Any] | None = None
        self.pulled: Target | None = None  # the target at its files in the cache

    async def pull(self, target: Target) -> Target:
        """`target` at its pulled files (as it is without a ModelKit): resolved and pulled
        once, again only where the files left the cache. Raises NotReachableYet (retried)
        or SpecfleetError."""
        source = target.modelkit
        if source is None:
            return target
        if self.pulled is not None and self.kit is not None and "pull" not in self.kit \
                and self._files_in_place(self.pulled):
            return self.pulled
        if self.kits is None:
            raise NotReachableYet("no ModelKit cache in this daemon")  # not a daemon's owner
        kits = self.kits
        try:
            resolved = await kits.resolve(source.ref)
        except RegistryError as exc:
            raise NotReachableYet(f"target '{self.name}': {exc}") from None
        # Untrusted (final): the trust policy refuses the manifest, before any layer is used.
        verdict = await kits.verify(resolved, *kits.trust_of(source))
        layers = resolved.layers(target)  # ArtifactError: this kit cannot serve it
        provenance = {**resolved.provenance(layers), **verdict.provenance()}
        self.kit = {**provenance, "pull": {"done": 0, "total": 0}}
        said = f"{resolved.ref} is {resolved.digest}" + (
            f" (from the cache: {resolved.offline})" if resolved.offline else "")
        self._emit(f"{said}; pulling what is not cached", **provenance)

        def progress(done: int, total: int) -> None:  # read by the API, live (not journaled)
            self.kit = {**provenance, "pull": {"done": done, "total": total}}

        try:
            await kits.pull(resolved, layers, progress)
        except RegistryError as exc:
            self.kit = None
            raise NotReachableYet(f"target '{self.name}': {exc}") from None
        except BaseException:
            self.kit = None
            raise
        self.pulled = materialized(target, kits.store, layers)
        self.kit = provenance
        files = ", ".join(f"{role} {kits.store.place_of(x)}" for role, x in layers.items())
        self._emit(f"{said}; serving {files}", **provenance)
        return self.pulled

    async def pull_or_command(self, target: Target,
                              next_command: Callable[[], Awaitable[Request]]
                              ) -> Target | Request:
        """`target` at its pulled files, or the command that ended the pull: a shutdown, an
        unload or a removal by a reload takes effect at once, not after a download of
        minutes. A start or restart meanwhile is the start under way: taken and dropped."""
        if target.modelkit is None:
            return target
        pull = asyncio.create_task(self.pull(target), name=f"pull {self.name}")
        command: asyncio.Task[Request] | None = None
        try:
            while True:
                command = asyncio.create_task(next_command())
                done, _ = await asyncio.wait({pull, command},
                                             return_when=asyncio.FIRST_COMPLETED)
                if command not in done:
                    return pull.result()  # NotReachableYet (retried), SpecfleetError (final)
                request = command.result()
                if next_step(Phase.BACKOFF, request.command) is not Next.RUN \
                        or request.command is Command.REDEFINE:
                    return request
        finally:
            if command is not None and not command.done():
                command.cancel()  # a get() cancelled before it returned takes nothing
            if not pull.done():
                pull.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pull

    def _files_in_place(self, pulled: Target) -> bool:
        """Whether the pulled files are still in the cache (a prune by another process, or
        a hand, may have removed them since: then the next start pulls again). A draft from
        elsewhere (a file of its own, a Hugging Face id) is not the cache's."""
        root = self.kits.store.root if self.kits is not None else None
        files = [Path(f) for f in (pulled.model, pulled.speculation.draft) if f]
        return all(f.exists() for f in files if root is not None and f.is_relative_to(root))
