"""Load a fleet file: YAML with line numbers, schema, cross-checks, backend checks.

All problems are collected and reported together, sorted by line, one per line:
    fleet.yaml:12:11: targets.chat.port: must be at most 65535; got 70000
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from supervisor.config.crosscheck import check_api_token, cross_check
from supervisor.config.scalars import unwrap_annotation
from supervisor.config.schema import Fleet
from supervisor.config.yamlsource import (
    MISSING,
    Path_,
    Problem,
    SourceMap,
    YamlSyntaxError,
    dotted,
    load_yaml,
)
from supervisor.errors import FleetFileError

TOP_LEVEL_HINT = "a fleet file is a mapping with `version: 1` and `targets:` (and optionally daemon:, defaults:)"

# Backend checks run after the schema passes: (target) -> problems with target-relative paths.
TargetCheck = Callable[[Any], Iterable[Problem]]


@dataclass(frozen=True)
class LoadedFleet:
    fleet: Fleet
    source: SourceMap
    warnings: tuple[str, ...]
    # What this host lacks, by target (load_fleet's `waiting`): each line as an error reads.
    waiting: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    match = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as YAML writes it
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] = Fleet) -> type[BaseModel] | None:
    """The pydantic model class that a location inside `root` is validated against."""
    current: Any = root
    for step in loc:
        nxt = None
        for candidate in unwrap_annotation(current):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                field = candidate.model_fields.get(str(step))
                if field is not None:
                    nxt = field.annotation
            elif typing.get_origin(candidate) is dict:
                nxt = typing.get_args(candidate)[1]
            if nxt is not None:
                break
        if nxt is None:
            return None
        current = nxt
    models = [t for t in unwrap_annotation(current) if isinstance(t, type) and issubclass(t, BaseModel)]
    return models[0] if models else None


def validation_problems(exc: ValidationError, root: type[BaseModel],
                        prefix: Path_ = ()) -> list[Problem]:
    """A model's validation errors as the fleet file's problems, at `prefix` + their place
    in `root` (a launcher's settings model under `launcher_settings`)."""
    return [Problem((*prefix, *err["loc"]), _message(err, root)) for err in exc.errors()]


def _message(err: Any, root: type[BaseModel] = Fleet) -> str:
    kind, value, loc = err["type"], err.get("input"), err["loc"]
    ctx = err.get("ctx") or {}
    if kind == "missing":
        return f"required key '{loc[-1]}' is missing"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1], root)
        valid = [k for k in (model.model_fields if model else {}) if k != "name"]
        hint = did_you_mean(str(loc[-1]), valid)
        return f"unknown key '{loc[-1]}'{hint}; valid keys: {', '.join(valid)}"
    if kind in ("literal_error", "enum"):
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", ""))) or [
            str(v) for v in re.findall(r"(\d+)", str(ctx.get("expected", "")))]
        if isinstance(value, str) and "'" not in str(ctx.get("expected", "")) and \
                value.strip() in options:  # `version: "1"`
            return (f"expected the number {value.strip()}, got the string {_show(value)} "
                    "(remove the quotes)")
        hint = did_you_mean(str(value), options) if isinstance(value, str) else ""
        return f"{_show(value)} is not valid{hint}; expected one of: {', '.join(options)}"
    if kind == "string_pattern_mismatch":
        return (f"{_show(value)} is not a valid name: use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit, at most 63 characters")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping (key: value lines), got {_show(value)}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {_show(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"expected a whole number, got {_show(value)}"
    if kind in ("float_type", "float_parsing"):
        return f"expected a number, got {_show(value)}"
    if kind in ("string_type",):
        return f"expected text, got {_show(value)}"
    if kind == "strict_number":
        return f"expected {ctx.get('words')}, got {_show(value)}"
    if kind in ("bool_type", "bool_parsing", "strict_bool"):
        return f"expected true or false, got {_show(value)}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    msg = msg.replace("Input should be", "must be")
    return f"{msg}; got {_show(value)}"


def _locate(source: SourceMap, path: Path_) -> tuple[Path_, str]:
    """Map a validated path back to where it was written; inherited values point at defaults."""
    if path in source.marks or len(path) < 3 or path[0] != "targets":
        return path, ""
    target, rest = path[:2], path[2:]
    for end in range(len(rest), 0, -1):
        if (*target, *rest[:end]) in source.marks:
            return path, ""
        if ("defaults", *rest[:end]) in source.marks:
            return ("defaults", *rest[:end]), f" (inherited from {dotted(('defaults', *rest[:end]))})"
    return path, ""


def _format(source: SourceMap, problem: Problem) -> tuple[int, int, str, str]:
    """(line, column, message, full text) for sorting and de-duplication."""
    path, note = _locate(source, problem.path)
    mark = source.find(path)
    where = f"{source.file}:{mark.line}:{mark.column}" if mark else source.file
    prefix = "warning: " if problem.severity == "warning" else ""
    line, column = (mark.line, mark.column) if mark else (0, 0)
    text = f"{where}: {prefix}{dotted(problem.path)}{note}: {problem.message}"
    return line, column, problem.message, text


def _schema_problems(data: dict[str, Any]) -> tuple[Fleet | None, list[Problem]]:
    """Validate once: the Fleet if the schema holds, and every schema problem."""
    problems = []
    for name, raw in (data.get("targets") or {}).items() if isinstance(data.get("targets"), dict) else ():
        if isinstance(raw, dict) and "name" in raw:
            problems.append(Problem(("targets", name, "name"),
                                    "a target's name is its key under targets:; remove name:"))
    fleet = None
    try:
        fleet = Fleet.model_validate(_without_names(data))
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            if loc[-1:] == ("[key]",):  # a bad key of a mapping: reported at the key
                loc = loc[:-1]
            # A missing key is reported at the mapping that lacks it; a bad name at its key.
            if err["type"] == "missing" or (loc[:1] == ("targets",) and loc[2:] == ("name",)):
                loc = loc[:-1]
            problems.append(Problem(loc, _message(err)))
    return fleet, problems


def _without_names(data: dict[str, Any]) -> dict[str, Any]:
    """The document with any `name:` inside targets dropped (reported separately)."""
    targets = data.get("targets")
    if not isinstance(targets, dict):
        return data
    return {**data, "targets": {
        k: ({kk: vv for kk, vv in v.items() if kk != "name"} if isinstance(v, dict) else v)
        for k, v in targets.items()}}


def _dedupe(formatted: list[tuple[int, int, str, str]]) -> list[str]:
    # A bad value under defaults: is inherited by every target; report it once, where written.
    seen: set[tuple[int, int, str]] = set()
    out = []
    for line, column, message, text in formatted:
        if (line, column, message) not in seen:
            seen.add((line, column, message))
            out.append(text)
    return out


def _read_yaml(path: Path, environ: dict[str, str] | None) -> tuple[Any, SourceMap, list[Problem]]:
    """load_yaml, every failure a FleetFileError naming the file; the limits in yamlsource
    should catch hostile YAML first, the rest is a last line of defence."""
    try:
        return load_yaml(path, environ)
    except YamlSyntaxError as exc:
        where = f"{path}:{exc.mark.line}:{exc.mark.column}" if exc.mark else str(path)
        at = f"{dotted(exc.path)}: " if exc.path else ""
        raise FleetFileError([f"{where}: {at}{exc.message}"]) from None
    except RecursionError:
        raise FleetFileError([f"{path}: the YAML is nested or aliased too deeply to read"]) from None
    except MemoryError:
        raise FleetFileError([f"{path}: the YAML is too large to read (out of memory)"]) from None
    except ValueError as exc:
        raise FleetFileError([f"{path}: the YAML cannot be read: {exc}"]) from None


def load_fleet(path: str | Path, check_target: TargetCheck | None = None,
               environ: dict[str, str] | None = None, *,
               check_host: bool = False, waiting: bool = False) -> LoadedFleet:
    """Parse and validate a fleet file, or raise FleetFileError listing every problem.

    `check_target` adds each target's backend checks. `check_host` adds what only the host
    that runs the daemon has: that daemon.api_token can be read, as `run` requires (`check`,
    `run` and a reload ask for it; `export`, which describes the fleet to a router on
    another host, and `status`, which only needs the state dir, do not). With `waiting`
    (`run`, a reload), what the host lacks for a target (severity MISSING: a model file, a
    binary) is that target's to wait for, in `LoadedFleet.waiting`, not an error of the
    file; without (`check`) it is an error."""
    path = Path(path)
    data, source, problems = _read_yaml(path, environ)
    if data is None:
        raise FleetFileError([f"{path}:1:1: the file is empty; {TOP_LEVEL_HINT}"])
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"the value {_show(data)}"
        raise FleetFileError([f"{path}:1:1: (top level): found {kind}; {TOP_LEVEL_HINT}"])

    fleet, schema_problems = _schema_problems(data)
    problems = [*problems, *schema_problems]
    if any(p.severity == "error" for p in problems):
        fleet = None
    if fleet is not None:
        problems += cross_check(fleet)
        if check_host:
            problems += check_api_token(fleet)
        if check_target is not None:
            for name, target in fleet.targets.items():
                problems += [Problem(("targets", name, *p.path), p.message, p.severity)
                             for p in check_target(target)]

    fatal = ("error",) if waiting else ("error", MISSING)
    errors = _dedupe(sorted(_format(source, p) for p in problems if p.severity in fatal))
    warnings = tuple(_dedupe(sorted(_format(source, p) for p in problems
                                    if p.severity == "warning")))
    if errors or fleet is None:
        raise FleetFileError(errors)
    lacking: dict[str, list[Problem]] = {}
    for p in problems if waiting else ():
        if p.severity == MISSING and p.path[:1] == ("targets",) and len(p.path) > 1:
            lacking.setdefault(str(p.path[1]), []).append(p)
    return LoadedFleet(fleet, source, warnings, {
        name: tuple(_dedupe(sorted(_format(source, p) for p in found)))
        for name, found in lacking.items()})
