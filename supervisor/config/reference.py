"""docs/fleet-file.md, rendered from the fleet-file schema so that the two cannot drift.

    python -m supervisor.config.reference > docs/fleet-file.md

A pure function of the pydantic models in supervisor/config/schema.py: one section per
model (in the order the fleet file nests them), one table row per field, with its type or
valid values (from the annotation, its validators and its bounds), its default and its
`description=`. A field without a description stops the renderer: every key has a meaning.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel, BeforeValidator
from pydantic.fields import FieldInfo

from supervisor.config.measures import parse_duration, parse_fraction, parse_size
from supervisor.config.scalars import unwrap_annotation
from supervisor.config.schema import Fleet
from supervisor.config.yamlsource import (
    MAX_ALIAS_CHARS,
    MAX_ALIAS_VALUES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NUMBER_CHARS,
    MAX_SCALAR_CHARS,
    MAX_VALUES,
)

REGENERATE = "python -m supervisor.config.reference > docs/fleet-file.md"
# Sections documented by reference only: their keys are those of another section, and
# nested mappings are not repeated (defaults.restart.window is targets.<name>.restart.window).
REFERENCES = {"defaults": "targets.<name>"}
_UNITS = {parse_duration: "duration", parse_size: "size", parse_fraction: "fraction"}
_PLURALS = {"integer": "integers", "number": "numbers", "size": "sizes", "duration": "durations"}

INTRO = f"""\
# The fleet file (schema version 1)

<!-- Generated from supervisor/config/schema.py by `{REGENERATE}`.
     Edit the schema's descriptions or supervisor/config/reference.py, not this file. -->

A fleet file is one YAML file that lists the LLM servers specfleet runs (the *targets*) and
the settings of the daemon that runs them. `specfleet check FILE` validates it and reports
every problem at once, each with `file:line:column` and the dotted path used in the tables
below (`targets.chat.restart.window`); `specfleet run FILE` runs it; SIGHUP reloads it.

This reference is generated from the schema (`supervisor/config/schema.py`), so it lists
every key there is. Regenerate it with `{REGENERATE}`; a test fails when it is stale.

## Example

```yaml
version: 1
daemon:
  api: 127.0.0.1:9910                 # the HTTP API and /metrics
  proxy: {{listen: 127.0.0.1:9911, hold: 2m}}
  gpu: {{headroom: 1GiB}}
defaults:                             # inherited by every target
  backend: llamacpp
  args: [--ctx-size, 8192]
  restart: {{max_crashes: 5, window: 10m}}
targets:
  qwen3-8b:                           # the key is the target's name
    model: /models/qwen3-8b-q6_k.gguf
    port: 8080
    gpus: [0]
    speculation:
      method: draft
      draft: /models/qwen3-0.6b-q4_k_m.gguf
      length: {{start: 8, min: 2, max: 16}}
    tuning: {{min_gain: 5%, cooldown: 15m}}
  gemma-ngram:
    model: ${{MODELS:-/models}}/gemma-3-270m-q4_k_m.gguf
    port: 8081
    speculation: {{method: ngram, variant: mod}}
    health: {{interval: 5s, start_timeout: 10m}}
```

## Rules

- The top level is `version: 1` and `targets:`, optionally `daemon:` and `defaults:`. A key
  that is not in the tables below is an error (with "did you mean").
- A target's name is its key under `targets:`.
- `defaults:` is merged into every target: mappings merge key by key (so
  `defaults.restart.window` and a target's own `restart.max_crashes` both apply), any other
  value the target sets replaces the default.
- **Durations**: a number with a unit, `500ms`, `30s`, `5m`, `2h`, `1d`, or several in a row
  such as `1h30m` (units in lower case), or a plain number of seconds (`90`, `1.5`); at
  most `365d` (a year), never `inf`.
- **Sizes**: `512MiB`, `1GiB` (`KiB`, `MiB`, `GiB`, `TiB`: powers of 1024, `B` optional),
  `512MB`, `2G` (`K`, `M`, `G`, `T`: powers of 1000), in any case, or a plain number of
  bytes. `512M` is 512,000,000 bytes, not 512MiB. At most `1024TiB`.
- Every number has a finite range, given with its key below where it has one of its own.
- **Fractions**: a percentage such as `5%`, or a number from 0 to 1 such as `0.05`.
- `${{VAR}}` and `${{VAR:-default}}` are expanded in every string (the default also replaces an
  empty variable); `$$` is a literal `$`; an unset variable without a default is an error.
  `~` is expanded in paths.
- **Numbers and booleans**: `true` and `false` are never numbers (`port: true` is an error),
  and a boolean is `true` or `false` only (not `1` or `yes` in quotes). Text of digits is a
  number (`port: "8080"`), so that `port: ${{PORT}}` works; `version` is the number `1`.
- Numbers in `args:` and in `env:` values (`[-ngl, 99]`) become strings. YAML anchors and
  merge keys (`<<: *common`) work; duplicate keys and tab indentation are errors, and so
  are a mapping or list used as a key, a NUL character (`"\\0"`) anywhere, and any tag but
  the standard `!!str`, `!!int`, `!!float`, `!!bool`, `!!null`, `!!map` and `!!seq`
  (`!!python/...` and custom `!tags` are refused, never dropped).
- **Limits**: a fleet file is written by hand, so YAML that only an attack or a mistake
  produces is refused, within bounded time and memory, with the limit it hit named:
  - the file: at most {MAX_FILE_BYTES // 1024} KiB;
  - nesting: at most {MAX_DEPTH} levels deep;
  - values: at most {MAX_VALUES:,} in the whole file, aliases expanded;
  - one value: at most {MAX_SCALAR_CHARS // 1024} KiB of text, one number at most {MAX_NUMBER_CHARS} characters;
  - aliases (`*name`, `<<: *name`): at most {MAX_ALIAS_VALUES:,} values and {MAX_ALIAS_CHARS // 1024} KiB of text
    produced by expanding them; an alias inside its own anchor (`&r [a, *r]`) is an error.
- *unset* in the default column means the key is absent; the meaning says what applies then.
"""


@dataclass(frozen=True)
class Section:
    """One table: the fields of `model`, found at the dotted `path` of the fleet file."""

    path: str
    model: type[BaseModel]


def _unwrap(annotation: Any) -> list[Any]:
    """The types inside Annotated, Optional and unions, None left out."""
    return [t for t in unwrap_annotation(annotation) if t is not type(None)]


def nested_model(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a field holds and the path suffix to it: `` for a mapping, `.<name>` for a
    mapping of named mappings (targets:)."""
    for kind in _unwrap(annotation):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind, ""
        if typing.get_origin(kind) is dict:
            value = typing.get_args(kind)[1]
            if isinstance(value, type) and issubclass(value, BaseModel):
                return value, ".<name>"
    return None


def sections(model: type[BaseModel] = Fleet, path: str = "") -> list[Section]:
    """Every section in fleet-file order: a model, then the models nested in it."""
    out = [Section(path, model)]
    if path in REFERENCES:
        return out
    for key, field in model.model_fields.items():
        nested = nested_model(field.annotation)
        if nested is not None:
            child, suffix = nested
            out += sections(child, f"{path}.{key}{suffix}" if path else f"{key}{suffix}")
    return out


def anchor(path: str) -> str:
    """GitHub's anchor of the heading `## \\`path\\``."""
    return "#" + re.sub(r"[^a-z0-9 _-]", "", path.lower()).replace(" ", "-")


def _constraints(metadata: list[Any]) -> tuple[str | None, list[Any]]:
    """The unit a validator parses (duration, size, fraction) and the bounds, flattened."""
    unit, bounds = None, []
    for item in metadata:
        if isinstance(item, BeforeValidator) and item.func in _UNITS:
            unit = _UNITS[item.func]
        elif isinstance(item, FieldInfo):
            bounds += item.metadata
        elif isinstance(item, annotated_types.Ge | annotated_types.Gt | annotated_types.Le):
            bounds.append(item)
    return unit, bounds


def _number(value: float) -> str:
    """A bound as a reader writes it: 10,000,000 rather than 1e+07, 65535 as it is."""
    if float(value).is_integer() and value >= 1_000_000:
        return f"{value:,.0f}"
    return f"{value:g}"


def _bounds_text(bounds: list[Any], unit: str | None) -> str:
    low = next((b for b in bounds if isinstance(b, annotated_types.Ge | annotated_types.Gt)), None)
    high = next((b for b in bounds if isinstance(b, annotated_types.Le)), None)
    lo = None if low is None else getattr(low, "ge", None)
    if unit and lo == 0 and (high is None or high.le == 1):
        return ""  # what the unit allows anyway
    top = "" if high is None else f" and ≤ {_number(high.le)}"
    if isinstance(low, annotated_types.Gt):
        return f" > {_number(low.gt)}{top}"
    if lo is not None and high is not None:
        return f" {_number(lo)}–{_number(high.le)}"
    if lo is not None:
        return f" ≥ {_number(lo)}"
    return f" ≤ {_number(high.le)}" if high is not None else ""


def describe_type(annotation: Any, metadata: list[Any]) -> str:
    """The type column: a type name with unit and bounds, or the valid values."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return describe_type(inner, [*metadata, *extra])
    members = [m for m in typing.get_args(annotation) if m is not type(None)]
    if origin in (typing.Union, types.UnionType) and len(members) == 1:
        return describe_type(members[0], metadata)  # Optional: the unit of what it holds
    kinds = _unwrap(annotation)
    if len(kinds) > 1:
        return " or ".join(describe_type(kind, []) for kind in kinds)
    kind = kinds[0]
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        values = [f"`{v}`" for v in typing.get_args(kind)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if origin is tuple:
        item, *rest = describe_type(typing.get_args(kind)[0], []).split(" ", 1)
        return " ".join(["list of", _PLURALS.get(item, item), *rest])
    if origin is dict:
        value = typing.get_args(kind)[1]
        return "mapping" if value is Any else "mapping of names to " + describe_type(value, [])
    unit, bounds = _constraints(metadata)
    names = {bool: "true or false", int: "integer", float: "number", str: "text"}
    return (unit or names.get(kind, getattr(kind, "__name__", str(kind)))) + \
        _bounds_text(bounds, unit)


def _seconds_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _bytes_text(count: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size and count % size == 0:
            return f"{count // size}{unit}"
    return str(count)


def _value_text(value: Any, unit: str | None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if unit == "duration":
        return _seconds_text(value)
    if unit == "size":
        return _bytes_text(value)
    if unit == "fraction":
        return f"{round(value * 100, 6):g}%"
    if isinstance(value, tuple | list | dict):
        return "{}" if isinstance(value, dict) else "[]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe_default(field: FieldInfo, from_key: bool = False) -> str:
    """The default column: a value as it would be written in the file."""
    if from_key:
        return "its key"
    if field.is_required():
        return "**required**"
    factory = field.default_factory
    if factory in (dict, list, tuple):
        return "`{}`" if factory is dict else "`[]`"
    if factory is not None:
        doc = (factory.__doc__ or "").strip().splitlines()
        if not doc:
            raise ValueError(f"default factory {factory.__name__} needs a docstring to document it")
        return doc[0].rstrip(".")
    value = field.default
    if value is None or value == "":  # "" stands for absent (a target's model with a modelkit)
        return "unset"
    if isinstance(value, BaseModel):
        return "see its keys"
    unit, _ = _constraints(field.metadata)
    return f"`{_value_text(value, unit)}`"


def prose(text: str) -> str:
    """Model and field text as markdown: docs/X.md and README.md become links."""
    text = re.sub(r"\bdocs/([\w.-]+\.md)\b", r"[docs/\1](\1)", " ".join(text.split()))
    return re.sub(r"(?<![/\w])README\.md\b", "[README.md](../README.md)", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(section: Section, key: str, field: FieldInfo) -> str:
    path = f"{section.path}.{key}" if section.path else key
    nested = nested_model(field.annotation)
    reference = REFERENCES.get(section.path)
    if reference is not None:
        other = f"{reference}.{key}"
        kind = (f"mapping, as [`{other}`]({anchor(other)})" if nested
                else describe_type(field.annotation, field.metadata))
        meaning = f"Default of `{other}` for every target; unset: that key's own default."
    else:
        if not field.description:
            raise ValueError(f"{section.model.__name__}.{key} ({path}) has no description=")
        meaning = prose(field.description)
        kind = describe_type(field.annotation, field.metadata)
        if nested is not None:
            child = path + nested[1]
            kind = ("mapping of names to mappings" if nested[1] else "mapping") + \
                f", see [`{child}`]({anchor(child)})"
    # Under a mapping of named mappings (targets.<name>), `name` is filled in from the key.
    default = describe_default(field, section.path.endswith(".<name>") and key == "name")
    return f"| `{path}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |"


def render_section(section: Section) -> str:
    """The heading, the model's docstring and the table of its keys."""
    title = f"`{section.path}`" if section.path else "Top level"
    doc = (section.model.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"## {title}", ""]
    if doc:
        lines += [prose(doc), ""]
    lines += ["| key | type / valid values | default | meaning |", "|---|---|---|---|"]
    lines += [_row(section, key, field) for key, field in section.model.model_fields.items()]
    return "\n".join(lines) + "\n"


def render(root: type[BaseModel] = Fleet) -> str:
    """The whole of docs/fleet-file.md."""
    return "\n".join([INTRO, *(render_section(s) for s in sections(root))])


if __name__ == "__main__":
    print(render(), end="")
