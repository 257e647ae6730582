"""A target whose model comes from a ModelKit (`modelkit:`): pulled before its first start.

The owner (owner.py) calls `pull_or_command` before each start; it acts once per owner, before
the first: the reference is resolved (the registry; its cache while the registry is down),
the model and draft layers are pulled where missing, and the owner runs the target with
`model` and `speculation.draft` at their files in the cache (registry/modelkits.py). The
target stays `starting` meanwhile (no process runs yet), the pull's progress in its live
status (the API's `modelkit.pull`; not in status.json, which would be rewritten at every
chunk). Events of kind `modelkit` say what was resolved and pulled. A registry that cannot
be reached with nothing cached is waited for (`waiting`, `unreachable`: the start is tried
again with backoff, waiting.py); a tampered layer or an artifact without the layers the
target needs fails the start for good, saying why. A tag that moved is seen at the next daemon start or reload
(daemon/fleet.py): a new owner pulls the new digest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from supervisor.config.schema import Target
from supervisor.errors import NotReachableYet
from supervisor.events import Event, EventBus
from supervisor.plugin.backend import Backend
from supervisor.registry.client import RegistryError
from supervisor.registry.modelkits import ModelKits, materialized
from supervisor.supervision.commands import Next, Phase, Request, next_step
from supervisor.tuning.autotuner import AutoTuner


class Owner(Protocol):
    name: str
    target: Target
    home: Backend
    backend: Backend
    tuner: AutoTuner
    events: EventBus
    kits: ModelKits | None
    kit: dict[str, Any] | None  # what was pulled (provenance), and the pull under way


async def pull_kit(owner: Owner) -> None:
    """Resolve and pull the target's ModelKit, once per owner; then the owner runs the
    target at the pulled files. Raises NotReachableYet (retried) or SpecfleetError."""
    source = owner.target.modelkit
    if source is None or (owner.kit is not None and "pull" not in owner.kit
                          and _files_in_place(owner)):
        return
    if owner.kits is None:
        raise NotReachableYet("no ModelKit cache in this daemon")  # not a daemon's owner
    kits = owner.kits
    try:
        resolved = await kits.resolve(source.ref)
    except RegistryError as exc:
        raise NotReachableYet(f"target '{owner.name}': {exc}") from None
    layers = resolved.layers(owner.target)  # ArtifactError: this kit cannot serve it
    provenance = resolved.provenance(layers)
    owner.kit = {**provenance, "pull": {"done": 0, "total": 0}}
    said = f"{resolved.ref} is {resolved.digest}" + (
        f" (from the cache: {resolved.offline})" if resolved.offline else "")
    _emit(owner, f"{said}; pulling what is not cached", **provenance)

    def progress(done: int, total: int) -> None:  # read by the API, live (not journaled)
        owner.kit = {**provenance, "pull": {"done": done, "total": total}}

    try:
        await kits.pull(resolved, layers, progress)
    except RegistryError as exc:
        owner.kit = None
        raise NotReachableYet(f"target '{owner.name}': {exc}") from None
    except BaseException:
        owner.kit = None
        raise
    retarget(owner, materialized(owner.target, kits.store, layers))
    owner.kit = provenance
    files = ", ".join(f"{role} {kits.store.place_of(x)}" for role, x in layers.items())
    _emit(owner, f"{said}; serving {files}", **provenance)


async def pull_or_command(owner: Owner, next_command: Callable[[], Awaitable[Request]]
                          ) -> Request | None:
    """The target's ModelKit pulled (None), or the command that ended the pull: a shutdown,
    an unload or a removal by a reload takes effect at once, not after a download of
    minutes. A start or restart meanwhile is the start under way: it is taken and dropped."""
    if owner.target.modelkit is None:
        return None
    pull = asyncio.create_task(pull_kit(owner), name=f"pull {owner.name}")
    command: asyncio.Task[Request] | None = None
    try:
        while True:
            command = asyncio.create_task(next_command())
            done, _ = await asyncio.wait({pull, command}, return_when=asyncio.FIRST_COMPLETED)
            if command not in done:
                pull.result()  # NotReachableYet (retried) or SpecfleetError (final)
                return None
            request = command.result()
            if next_step(Phase.BACKOFF, request.command) is not Next.RUN:
                return request
    finally:
        if command is not None and not command.done():
            command.cancel()  # a get() cancelled before it returned takes nothing
        if not pull.done():
            pull.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pull


def _files_in_place(owner: Owner) -> bool:
    """Whether the pulled files the target runs are still in the cache (a prune by another
    process, or a hand, may have removed them since: then the next start pulls again). A
    draft from elsewhere (a file of its own, a Hugging Face id) is not the cache's."""
    root = owner.kits.store.root if owner.kits is not None else None
    files = [Path(f) for f in (owner.target.model, owner.target.speculation.draft) if f]
    return all(f.exists() for f in files if root is not None and f.is_relative_to(root))


def retarget(owner: Owner, target: Target) -> None:
    """The owner runs `target` (the same but for its files) from its next start on."""
    owner.target = target
    owner.home = owner.home.with_target(target)
    # A reload's new server may have been put on another port beside the old one (its
    # backend, daemon/replacing.py): it stays there.
    port = owner.backend.target.port
    owner.backend = owner.home if port == target.port else owner.backend.with_target(
        target.model_copy(update={"port": port}))
    old = owner.tuner
    # Its memory belongs to the model's file (tuning/store.fingerprint): a new tuner.
    owner.tuner = AutoTuner(target, owner.home, old.store, old.emit, old.clock)
    owner.tuner.restart_is_free = old.restart_is_free


def _emit(owner: Owner, reason: str, **data: Any) -> None:
    owner.events.emit(Event(owner.name, "modelkit", reason, data=data))
