"""Backend plugins: one loading path for built-ins and third parties; bad hooks fail loudly."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.plugin.backend import Backend
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.registry import ENTRY_POINT_GROUP, build_registry


class EchoBackend(Backend):
    name = "echo"
    default_binary = "echo"


class EchoPlugin:
    @hookimpl
    def register_backends(self, register):
        register(EchoBackend)


class MisspelledPlugin:
    @hookimpl
    def register_backend(self, register):  # the hook is register_backends
        register(EchoBackend)


class ImpostorPlugin:
    @hookimpl
    def register_backends(self, register):
        register(type("Other", (Backend,), {"name": "llamacpp"}))


def test_the_built_in_llamacpp_backend_loads_through_the_entry_point_group():
    names = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert names.get("llamacpp") == "plugins.llamacpp"
    registry = build_registry()
    assert "llamacpp" in registry.names()
    assert registry.get("llamacpp").__module__.startswith("plugins.llamacpp")


def test_without_entry_points_no_backend_is_found_and_the_error_says_so():
    with pytest.raises(SpecfleetError, match="no backends are installed"):
        build_registry(entry_points=False)


def test_a_third_party_plugin_adds_a_backend_beside_the_built_ins():
    registry = build_registry([EchoPlugin()])
    built_in = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert {"llamacpp", "ollama", "vllm"} <= built_in
    assert registry.names() == sorted({"echo", *built_in})
    target = Target(name="e", backend="echo", model="m", port=9000)
    assert isinstance(registry.backend_for(target), EchoBackend)
    assert registry.check_target(target) == []


def test_a_misspelled_hook_fails_at_start_up():
    with pytest.raises(SpecfleetError, match="register_backend"):
        build_registry([MisspelledPlugin()])


def test_two_plugins_cannot_claim_the_same_backend_name():
    with pytest.raises(SpecfleetError, match="two plugins register backend 'llamacpp'"):
        build_registry([ImpostorPlugin()])


def test_an_unknown_backend_in_a_fleet_names_the_installed_ones():
    registry = build_registry()
    problems = registry.check_target(Target(name="x", backend="vlm", model="m", port=1))
    assert len(problems) == 1
    assert "'vlm' is not installed" in problems[0].message
    assert "installed: " in problems[0].message and "llamacpp" in problems[0].message
