"""Every installed launcher, built once for a daemon (or a command), and what the daemon
asks of all of them at once: the orphan sweep at start, connecting before a fleet is
applied, removing what targets no longer in the file left behind, closing. Which launcher
runs a target is the fleet file's `launcher:` looked up here; nothing else is by name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from supervisor.atomicfile import LOG_ONLY, StateReport
from supervisor.config.schema import Daemon, Fleet, Target
from supervisor.errors import SpecfleetError
from supervisor.launcher.children import ChildRegistry
from supervisor.plugin.launching import Launcher, LauncherContext
from supervisor.plugin.registry import Registry


class InstalledLaunchers:
    def __init__(self, registry: Registry, settings: Daemon,
                 target_named: Callable[[str], Target],
                 target_event: Callable[[str, str], None] = lambda target, reason: None,
                 report: StateReport = LOG_ONLY) -> None:
        state_dir = Path(settings.state_dir).expanduser()
        # The processes started on this machine, whichever launcher started them (a child,
        # a private Ray cluster's), for the next daemon's orphan sweep.
        self.children = ChildRegistry(state_dir / "children.json", report)
        context = LauncherContext(settings, state_dir, target_named, target_event,
                                  self.children, report)
        self._by_name: dict[str, Launcher] = {
            name: cls.from_context(context) for name, cls in sorted(registry.launchers.items())}

    def for_target(self, target: Target) -> Launcher:
        launcher = self._by_name.get(target.launcher)
        if launcher is None:  # the fleet file's check refuses it first
            raise SpecfleetError(f"launcher {target.launcher!r} is not installed")
        return launcher

    def sweep_orphans(self) -> list[str]:
        return [killed for launcher in self._by_name.values()
                for killed in launcher.sweep_orphans()]

    async def prepare(self, fleet: Fleet) -> None:
        for launcher in self._by_name.values():
            await launcher.prepare(fleet)

    async def remove_leftovers(self, fleet: Fleet) -> list[str]:
        return [said for launcher in self._by_name.values()
                for said in await launcher.remove_leftovers(fleet)]

    async def close(self) -> None:
        for launcher in self._by_name.values():
            await launcher.close()
