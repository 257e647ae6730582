"""Every duration, size and number in the fleet file has a finite range, and a value past
it is a `check` error with its file:line, dotted path, value and range, never a value the
daemon meets later (`interval: 99999999999999999999h` once turned health checks off after
the first; `window: 1e400` raised OverflowError inside the daemon at the first crash).

The keys are found by walking the schema, so a key added later is covered too."""

from __future__ import annotations

import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, BeforeValidator

from supervisor.config.loader import load_fleet
from supervisor.config.measures import parse_duration, parse_size
from supervisor.config.scalars import unwrap_annotation
from supervisor.config.schema import Daemon, Target
from supervisor.errors import FleetFileError
from tests.conftest import REPO

# YAML spellings past every range: `.inf` is YAML's infinity.
TOO_BIG = {"duration": "99999999999999999999h", "size": "99999999999999999999TiB",
           "integer": 10**30, "number": float("inf")}


def kind_of(annotation: Any, metadata: list[Any]) -> str | None:
    parsers = {m.func for m in metadata if isinstance(m, BeforeValidator)}
    if parse_duration in parsers:
        return "duration"
    if parse_size in parsers:
        return "size"
    kinds = unwrap_annotation(annotation)
    if bool in kinds or typing.get_origin(kinds[0]) is typing.Literal:
        return None
    return "integer" if int in kinds else "number" if float in kinds else None


def members(annotation: Any) -> list[tuple[Any, list[Any]]]:
    """Each member of a union with the metadata of its own Annotated (a field typed
    `Duration | None` carries its parser there, not on the field)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return [(t, [*extra, *meta]) for t, meta in members(base)]
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in members(arg)]
    return [(annotation, [])]


def numeric_keys(model: type[BaseModel], prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], str]]:
    """(path, kind) of every number the model takes, nested models, lists and mappings
    included; a list's or mapping's items are reached as `[item]` and `{x: item}`."""
    found = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        for candidate, metadata in members(field.annotation):
            origin, args = typing.get_origin(candidate), typing.get_args(candidate)
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found += numeric_keys(candidate, path)
            elif origin in (tuple, dict) and args:
                for item, item_meta in members(args[-1] if origin is dict else args[0]):
                    if kind := kind_of(item, item_meta):
                        found.append(((*path, "[]" if origin is tuple else "{}"), kind))
            elif kind := kind_of(candidate, [*metadata, *field.metadata]):
                found.append((path, kind))
    return list(dict.fromkeys(found))


KEYS = [(("daemon", *p), k) for p, k in numeric_keys(Daemon, ())] + \
       [(("targets", "t", *p), k) for p, k in numeric_keys(Target, ())]


def fleet_with(tmp_path: Path, path: tuple[str, ...], value: Any) -> Path:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    data: dict[str, Any] = {"version": 1, "daemon": {"state_dir": str(tmp_path / "s")},
                            "targets": {"t": {"model": str(model), "port": 8080}}}
    node = data
    *parents, last = path
    if last in ("[]", "{}"):
        *parents, last = parents
        value = [value] if path[-1] == "[]" else {"x": value}
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(data, sort_keys=False))
    return fleet


def test_the_walk_finds_the_keys_of_every_kind():
    dotted = {".".join(p): k for p, k in KEYS}
    assert dotted["targets.t.health.interval"] == "duration"
    assert dotted["targets.t.restart.window"] == "duration"
    assert dotted["daemon.log_max_bytes"] == "size"
    assert dotted["daemon.gpu.memory.[]"] == "size"
    assert dotted["targets.t.tuning.min_tokens"] == "integer"
    assert dotted["targets.t.ray.resources.{}"] == "number"
    assert dotted["targets.t.idle_unload"] == "duration"
    assert dotted["targets.t.gpus.[]"] == "integer"
    assert len(KEYS) > 30


@pytest.mark.parametrize(("path", "kind"), KEYS, ids=[".".join(p) for p, _ in KEYS])
def test_every_numeric_key_refuses_a_value_past_its_range(tmp_path, path, kind):
    fleet = fleet_with(tmp_path, path, TOO_BIG[kind])
    with pytest.raises(FleetFileError) as err:
        load_fleet(fleet)
    dotted = ".".join(p for p in path if p not in ("[]", "{}"))
    mine = [p for p in err.value.problems if f": {dotted}" in p]
    assert len(mine) == 1, err.value.problems
    assert mine[0].startswith(f"{fleet}:"), mine  # file:line:column first
    assert re.search(r"at most|less than or equal|finite|from \d+ to \d+", mine[0]), mine


@pytest.mark.parametrize(("key", "value", "says"), [
    ("health: {interval: 99999999999999999999h}", "'99999999999999999999h'", "365d"),
    ("restart: {window: 1e400}", "'1e400'", "365d"),
    ("restart: {window: inf}", "'inf'", "365d"),
    ("restart: {stop_grace: .inf}", "inf", "365d"),
    ("tuning: {min_tokens: 100000000000000000000}", "100000000000000000000", "1000000000"),
])
def test_check_refuses_the_values_that_once_passed(tmp_path, key, value, says):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"version: 1\ndaemon: {{state_dir: {tmp_path / 's'}}}\n"
                     f"targets:\n  t:\n    model: {model}\n    port: 8080\n    {key}\n")
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{fleet}:7:" in proc.stderr and value in proc.stderr and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
