"""`specfleet pull`: fetch the ModelKits a fleet file names ahead of time, into the daemon's
cache; and the resolution `check` prints (manifests only, no layer downloaded)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.config.schema import Fleet, Target
    from supervisor.registry.modelkits import ModelKits, Resolved


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pull", help="fetch the fleet's ModelKits into the daemon's cache",
                       description="Resolve every `modelkit:` of FILE and pull the layers its "
                       "target runs (the model, and the draft part) into the daemon's cache "
                       "(daemon.modelkits.cache), verified by digest, with progress on stderr. "
                       "A running daemon then starts them without a download.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--target", action="append", metavar="NAME",
                   help="only this target (again for more)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from supervisor.cli.common import load
    from supervisor.errors import SpecfleetError
    from supervisor.plugin.registry import default_registry

    fleet = load(args.file, default_registry()).fleet
    unknown = sorted(set(args.target or ()) - set(fleet.targets))
    if unknown:
        print(f"specfleet pull: no target {', '.join(unknown)} in {args.file}", file=sys.stderr)
        return 2
    targets = [t for t in fleet.targets.values() if t.modelkit is not None
               and (not args.target or t.name in args.target)]
    if not targets:
        print(f"{args.file}: no target takes its model from a ModelKit; nothing to pull")
        return 0
    try:
        asyncio.run(_pull_all(fleet, targets))
    except SpecfleetError as exc:
        print(f"specfleet pull: {exc}", file=sys.stderr)
        return 1
    return 0


async def _pull_all(fleet: Fleet, targets: list[Target]) -> None:
    async def each(kits: ModelKits) -> None:
        for target in targets:
            assert target.modelkit is not None
            resolved = await kits.resolve(target.modelkit.ref)
            verdict = await kits.verify(resolved, *kits.trust_of(target.modelkit))
            layers = resolved.layers(target)
            print(describe(target, resolved, kits))
            print(f"  signature: {verdict.provenance()['signature']}"
                  + (f" by {verdict.signed_by}" if verdict.signed_by else ""))
            await kits.pull(resolved, layers, _bar(target.name))
            print(f"  pulled: {', '.join(f'{r} {kits.store.place_of(x)}' for r, x in layers.items())}")

    await with_kits(fleet, each)


async def with_kits(fleet: Fleet, work: Callable[[ModelKits], Any], keep: bool = True) -> None:
    """`work(kits)` with the daemon's cache and a session of its own (`keep` False: no
    manifest is written). It never prunes the cache: only the daemon knows which layers its
    targets run (a running daemon's, of a tag since moved, are the least recently used)."""
    import aiohttp

    from supervisor.registry.modelkits import ModelKits
    from supervisor.registry.store import LayerStore

    settings = fleet.daemon.modelkits
    async with aiohttp.ClientSession() as session:
        await work(ModelKits(LayerStore(fleet.daemon.modelkit_cache), session, settings.timeout,
                             max_size=None, keep=keep, keys=settings.keys,
                             verify=settings.verify))


def describe(target: Target, resolved: Resolved, kits: ModelKits) -> str:
    """What a reference names, as `check` and `pull` print it."""
    package = resolved.artifact.package
    named = " ".join(package[k] for k in ("name", "version") if k in package) or "(no package)"
    lines = [f"[{target.name}] modelkit {resolved.ref} -> {resolved.digest} "
             f"({resolved.artifact.format}, {named})"]
    if resolved.offline:
        lines.append(f"  from the cache: {resolved.offline}")
    for role, layer in resolved.layers(target).items():
        # place_of, not path_of: looking (check) is not a use that keeps it from a prune
        cached = "cached" if kits.store.place_of(layer).exists() else "to pull"
        lines.append(f"  {role}: {layer.path} ({layer.size} bytes, {layer.digest}, {cached})")
    return "\n".join(lines)


def _bar(name: str) -> Callable[[int, int], None]:
    """Progress on stderr: a bar redrawn in place on a terminal, a line each 10 % else."""
    shown = [-1]

    def progress(done: int, total: int) -> None:
        share = done / total if total else 1.0
        if sys.stderr.isatty():
            filled = int(share * 30)
            print(f"\r  {name} [{'#' * filled}{'.' * (30 - filled)}] {share:4.0%} "
                  f"{done >> 20}/{total >> 20} MiB", end="" if done < total else "\n",
                  file=sys.stderr, flush=True)
        elif int(share * 10) > shown[0]:
            shown[0] = int(share * 10)
            print(f"  {name}: {share:.0%} ({done} of {total} bytes)", file=sys.stderr, flush=True)
    return progress


def resolved_targets(fleet: Fleet) -> tuple[dict[str, Target], list[str], list[str]]:
    """For `check`: each target as it would run (a ModelKit's files at their places in the
    cache, named by digest), what each reference names, and the references that cannot be
    resolved (the registry down and nothing cached, or an artifact the target cannot use)."""
    import asyncio

    from supervisor.errors import SpecfleetError
    from supervisor.registry.modelkits import materialized

    targets, said, problems = dict(fleet.targets), [], []

    async def each(kits: ModelKits) -> None:
        for name, target in fleet.targets.items():
            if target.modelkit is None:
                continue
            try:
                resolved = await kits.resolve(target.modelkit.ref)
                await kits.verify(resolved, *kits.trust_of(target.modelkit))
                targets[name] = materialized(target, kits.store, resolved.layers(target))
                said.append(describe(target, resolved, kits))
            except SpecfleetError as exc:
                problems.append(f"targets.{name}.modelkit: {exc}")

    if any(t.modelkit is not None for t in fleet.targets.values()):
        asyncio.run(with_kits(fleet, each, keep=False))
    return targets, said, problems
