"""Backend discovery: built-ins and third-party plugins load by one path.

Every backend, ours included, is found through the entry-point group
`specfleet.backends`, so a third-party package is a peer of the built-ins.
`check_pending()` makes a misspelled hook implementation fail at start-up
instead of being silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from types import ModuleType

import pluggy

from supervisor.config.loader import did_you_mean
from supervisor.config.schema import Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError
from supervisor.plugin import hookspecs
from supervisor.plugin.backend import Backend

ENTRY_POINT_GROUP = "specfleet.backends"


class BackendRegistry:
    def __init__(self, backends: dict[str, type[Backend]]) -> None:
        self._backends = backends

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
        problems = cls.check(target) + _check_variants(cls, target)
        if target.launcher == "external" and not cls.supports_external:
            problems.append(Problem(("launcher",), f"the {target.backend} backend cannot use a "
                                    "server it did not start; launcher: process or systemd"))
        if any(p.severity == "error" for p in problems):
            return problems
        where = ("speculation", "draft") if target.speculation.draft else ("speculation", "method")
        try:
            findings = cls(target).pairing_findings()
        except SpecfleetError as exc:
            return [*problems, Problem(where, str(exc))]
        return [*problems, *(Problem(where, f.message, f.level) for f in findings)]

    def backend_for(self, target: Target) -> Backend:
        cls = self._backends.get(target.backend)
        if cls is None:
            raise SpecfleetError(f"backend {target.backend!r} is not installed")
        return cls(target)


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
                   entry_points: bool = True) -> BackendRegistry:
    pm = pluggy.PluginManager("specfleet")
    pm.add_hookspecs(hookspecs)
    try:
        if entry_points:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for plugin in extra_plugins:
            pm.register(plugin)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise SpecfleetError(f"backend plugin {exc.plugin!r} is invalid: {exc}") from exc
    except Exception as exc:  # an entry point that fails to import: name it
        raise SpecfleetError(f"a backend plugin failed to load: {type(exc).__name__}: {exc}") from exc

    backends: dict[str, type[Backend]] = {}

    def register(cls: type) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Backend)) or not getattr(cls, "name", ""):
            raise SpecfleetError(f"{cls!r} is not a Backend subclass with a name")
        if cls.name in backends and backends[cls.name] is not cls:
            raise SpecfleetError(
                f"two plugins register backend '{cls.name}': "
                f"{backends[cls.name].__module__} and {cls.__module__}")
        backends[cls.name] = cls

    pm.hook.register_backends(register=register)
    if not backends:
        raise SpecfleetError(
            "no backends are installed: specfleet's own backends load through the "
            f"'{ENTRY_POINT_GROUP}' entry points; install the package (pip install -e .)")
    return BackendRegistry(backends)


@cache
def default_registry() -> BackendRegistry:
    return build_registry()
