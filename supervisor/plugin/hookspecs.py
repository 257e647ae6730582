"""Plugin hooks. Hooks only register things; behaviour lives on the Backend and Launcher
base classes."""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("specfleet")
hookimpl = pluggy.HookimplMarker("specfleet")


@hookspec
def register_backends(register: Callable[[type], None]) -> None:
    """Call register(BackendSubclass) once for each backend this plugin provides."""


@hookspec
def register_launchers(register: Callable[[type], None]) -> None:
    """Call register(LauncherSubclass) once for each launcher this plugin provides."""
