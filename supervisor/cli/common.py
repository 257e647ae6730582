"""What several commands share: loading the fleet file the way the CLI reports it."""

from __future__ import annotations

import sys

from supervisor.config.loader import LoadedFleet, load_fleet
from supervisor.plugin.registry import BackendRegistry


def load(path: str, registry: BackendRegistry) -> LoadedFleet:
    """The fleet at `path`, checked by the registry's backends; its warnings go to stderr
    because stdout carries the command's own output (commands, configs) for pipes."""
    loaded = load_fleet(path, registry.check_target)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    return loaded
