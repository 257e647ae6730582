"""What several commands share: loading the fleet file the way the CLI reports it."""

from __future__ import annotations

import sys
from collections.abc import Callable

from supervisor.config.loader import LoadedFleet, load_fleet
from supervisor.config.schema import Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError
from supervisor.plugin.registry import Registry


def load(path: str, registry: Registry, runtime_files: bool = True,
         waiting: bool = False) -> LoadedFleet:
    """The fleet at `path`, checked by the registry's backends; its warnings go to stderr
    because stdout carries the command's own output (commands, configs) for pipes.

    `runtime_files=False` is for commands that only describe the fleet to something else
    (`export`): what the backends check (model and draft files, the runtime binary, the
    pairing of model and draft, even whether the backend is installed) needs the host that
    runs the models, not a router's host, so those problems become warnings; nor are the
    host's own checks made (a token file that only the daemon's host has).

    `waiting` (`run`): what the host lacks for a target is that target's to wait for
    (LoadedFleet.waiting), not an error of the file."""
    check = registry.check_target if runtime_files else _as_warnings(registry)
    loaded = load_fleet(path, check, check_host=runtime_files, waiting=waiting)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    return loaded


def speculating_target(path: str, name: str, registry: Registry, what: str) -> tuple[
        LoadedFleet, Target]:
    """The fleet at `path` and its target `name`, which must speculate (`what`: the
    command's reason, said when it does not)."""
    loaded = load(path, registry)
    target = loaded.fleet.targets.get(name)
    if target is None:
        raise SpecfleetError(f"no target {name!r} in {path}; targets: "
                             f"{', '.join(loaded.fleet.targets) or '(none)'}")
    if target.speculation.method == "none":
        raise SpecfleetError(f"target {name!r} has no speculation {what} (speculation.method "
                             "is none)")
    return loaded, target


def _as_warnings(registry: Registry) -> Callable[[Target], list[Problem]]:
    def check(target: Target) -> list[Problem]:
        return [Problem(p.path, p.message if p.severity == "warning" else
                        f"{p.message} (not needed here; `specfleet check` on the host that "
                        "runs the fleet reports it as an error)", "warning")
                for p in registry.check_target(target)]
    return check
