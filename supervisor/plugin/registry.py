"""Plugin discovery: built-ins and third-party plugins load by one path.

Every backend, ours included, is found through the entry-point group
`specfleet.backends`, and every launcher through `specfleet.launchers`, so a
third-party package is a peer of the built-ins. `check_pending()` makes a
misspelled hook implementation fail at start-up instead of being silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from types import ModuleType
from typing import Any

import pluggy
from pydantic import ValidationError

from supervisor.config.loader import did_you_mean, validation_problems
from supervisor.config.schema import Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError
from supervisor.plugin import hookspecs
from supervisor.plugin.backend import Backend
from supervisor.plugin.helpers import pairing_findings
from supervisor.plugin.launching import Launcher, declare

ENTRY_POINT_GROUP = "specfleet.backends"
LAUNCHER_GROUP = "specfleet.launchers"


class Registry:
    def __init__(self, backends: dict[str, type[Backend]],
                 launchers: dict[str, type[Launcher]]) -> None:
        self._backends = backends
        self.launchers = launchers
        for name, cls in launchers.items():  # what a backend asks of its target's launcher
            declare(name, cls.traits)

    def names(self) -> list[str]:
        return sorted(self._backends)

    def get(self, name: str) -> type[Backend] | None:
        return self._backends.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._backends

    def check_target(self, target: Target) -> list[Problem]:
        """Backend-specific checks of one target, for the fleet loader."""
        cls = self._backends.get(target.backend)
        if cls is None:
            hint = did_you_mean(target.backend, self._backends)
            return [Problem(("backend",), f"backend {target.backend!r} is not installed{hint}; "
                                          f"installed: {', '.join(self.names())}")]
        launcher = self.launchers.get(target.launcher)
        if launcher is None:
            hint = did_you_mean(target.launcher, self.launchers)
            return [Problem(("launcher",), f"launcher {target.launcher!r} is not installed"
                            f"{hint}; installed: {', '.join(sorted(self.launchers))}")]
        problems = [*_check_sections(target, self.launchers),
                    *_check_launcher_settings(launcher, target), *launcher.check(target),
                    *cls.check(target), *_check_variants(cls, target)]
        if not launcher.traits.starts_server and not cls.supports_external:
            problems.append(Problem(("launcher",), f"the {target.backend} backend cannot use a "
                                    "server it did not start; launcher: process or systemd"))
        if target.modelkit is not None and not cls.takes_modelkits:
            problems.append(Problem(("modelkit",), f"the {target.backend} backend cannot serve "
                                    "a model from a ModelKit (its GGUF files are served by "
                                    "llamacpp); set model: instead"))
        if any(p.severity == "error" for p in problems) or not target.model:
            return problems  # a ModelKit's files are checked once pulled (at the start)
        where = ("speculation", "draft") if target.speculation.draft else ("speculation", "method")
        try:
            findings = pairing_findings(cls(target))
        except SpecfleetError as exc:
            return [*problems, Problem(where, str(exc))]
        return [*problems, *(Problem(where, f.message, f.level) for f in findings)]

    def backend_for(self, target: Target) -> Backend:
        cls = self._backends.get(target.backend)
        if cls is None:
            raise SpecfleetError(f"backend {target.backend!r} is not installed")
        return cls(target)

    def launcher_class(self, target: Target) -> type[Launcher]:
        cls = self.launchers.get(target.launcher)
        if cls is None:
            raise SpecfleetError(f"launcher {target.launcher!r} is not installed")
        return cls


def _check_sections(target: Target, launchers: dict[str, type[Launcher]]) -> list[Problem]:
    """A key that only another launcher reads (`ray:` under launcher: process) does nothing:
    said as a warning, where the user set it."""
    problems = []
    for name, cls in sorted(launchers.items()):
        key = cls.traits.section
        if key is None or name == target.launcher or not hasattr(target, key):
            continue
        value = getattr(target, key)
        if value != type(value)():
            problems.append(Problem((key,), f"{key}: applies to launcher: {name} only "
                                    f"(launcher is {target.launcher}); remove it or set "
                                    f"launcher: {name}", "warning"))
    return problems


def _check_launcher_settings(launcher: type[Launcher], target: Target) -> list[Problem]:
    """`launcher_settings` against the model the target's launcher declares."""
    if launcher.settings is None:
        return [Problem(("launcher_settings",), f"launcher {target.launcher!r} takes no "
                        "launcher_settings; remove them")] if target.launcher_settings else []
    try:
        launcher.settings.model_validate(target.launcher_settings)
    except ValidationError as exc:
        return validation_problems(exc, launcher.settings, ("launcher_settings",))
    return []


def _check_variants(cls: type[Backend], target: Target) -> list[Problem]:
    """`speculation.variants` names variants this runtime can switch between."""
    wanted = target.speculation.variants
    if not isinstance(wanted, tuple) and wanted != "auto":
        return []
    has = cls(target).ngram_variants()
    if not has:
        return [Problem(("speculation", "variants"), f"the {target.backend} backend has no "
                        "n-gram variants to switch between; remove variants")]
    missing = [v for v in wanted if v not in has] if isinstance(wanted, tuple) else []
    if missing:
        return [Problem(("speculation", "variants"), f"{', '.join(missing)}: not a variant the "
                        f"tuner can switch to on {target.backend}; valid: {', '.join(has)}")]
    return []


def build_registry(extra_plugins: Iterable[ModuleType | object] = (),
                   entry_points: bool = True) -> Registry:
    """Every installed backend and launcher. Without `entry_points` only `extra_plugins`'
    backends are taken (a test's own), and the installed launchers still are: a launcher
    registered by an extra plugin is added to them."""
    pm = pluggy.PluginManager("specfleet")
    pm.add_hookspecs(hookspecs)
    try:
        if entry_points:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        pm.load_setuptools_entrypoints(LAUNCHER_GROUP)
        for plugin in extra_plugins:
            pm.register(plugin)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise SpecfleetError(f"backend plugin {exc.plugin!r} is invalid: {exc}") from exc
    except Exception as exc:  # an entry point that fails to import: name it
        raise SpecfleetError(f"a backend plugin failed to load: {type(exc).__name__}: {exc}") from exc

    backends: dict[str, type[Backend]] = {}
    launchers: dict[str, type[Launcher]] = {}
    pm.hook.register_backends(register=_registrar(backends, Backend, "backend"))
    pm.hook.register_launchers(register=_registrar(launchers, Launcher, "launcher"))
    for kind, found, group in (("backends", backends, ENTRY_POINT_GROUP),
                               ("launchers", launchers, LAUNCHER_GROUP)):
        if not found:
            raise SpecfleetError(
                f"no {kind} are installed: specfleet's own {kind} load through the "
                f"'{group}' entry points; install the package (pip install -e .)")
    return Registry(backends, launchers)


def _registrar(into: dict[str, Any], base: type, kind: str) -> Callable[[type], None]:
    def register(cls: type) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)) or not getattr(cls, "name", ""):
            raise SpecfleetError(f"{cls!r} is not a {base.__name__} subclass with a name")
        if cls.name in into and into[cls.name] is not cls:
            raise SpecfleetError(
                f"two plugins register {kind} '{cls.name}': "
                f"{into[cls.name].__module__} and {cls.__module__}")
        into[cls.name] = cls
    return register


@cache
def default_registry() -> Registry:
    return build_registry()
