"""YAML that remembers where every value came from.

PyYAML's composer gives nodes with start marks; we build plain Python values from
those nodes ourselves and keep a side table from dotted path to (line, column), so
that every later error (schema, cross-check, backend check) can name the line.
We also refuse what PyYAML silently accepts: duplicate keys (the last one wins,
which hides typos) and non-string keys.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    line: int  # 1-based
    column: int  # 1-based


@dataclass
class SourceMap:
    """Where each dotted path of the document was written."""

    file: str
    marks: dict[Path_, Mark] = field(default_factory=dict)

    def find(self, path: Path_) -> Mark | None:
        """The mark of `path`, or of its nearest ancestor that has one."""
        for end in range(len(path), -1, -1):
            if (mark := self.marks.get(tuple(path[:end]))) is not None:
                return mark
        return None


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the fleet file, located by dotted path."""

    path: Path_
    message: str
    severity: str = "error"  # or "warning"


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


class YamlSyntaxError(Exception):
    def __init__(self, message: str, mark: Mark | None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


_ENV = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(text: str, environ: dict[str, str]) -> tuple[str, list[str]]:
    """Expand ${VAR} and ${VAR:-default}; `$$` is a literal `$`. Returns (value, missing vars)."""
    missing: list[str] = []

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, default = m.group(1), m.group(2)
        value = environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                missing.append(name)
                return ""
            return default
        return value

    return _ENV.sub(sub, text), missing


def _mark(node: yaml.Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    def __init__(self, source: SourceMap, environ: dict[str, str]) -> None:
        self.source = source
        self.environ = environ
        self.problems: list[Problem] = []
        self._scalars = yaml.SafeLoader("")  # only its scalar constructors are used

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.source.marks.setdefault(path, _mark(node))
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        value = self._scalars.construct_object(node)
        if isinstance(value, str) and "$" in value:
            value, missing = expand_env(value, self.environ)
            for name in missing:
                self.problems.append(Problem(
                    path, f"environment variable {name} is not set "
                          f"(write ${{{name}:-default}} to give a default)"))
        return value

    def _mapping(self, node: yaml.MappingNode, path: Path_) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                merged = self.build(value_node, path)
                for src in merged if isinstance(merged, list) else [merged]:
                    if isinstance(src, dict):
                        for k, v in src.items():
                            out.setdefault(k, v)
                continue
            key = self._scalars.construct_object(key_node)
            if not isinstance(key, str):
                # Unquoted `8080:` or `yes:` become int/bool keys; names are always strings here.
                key = str(key).lower() if isinstance(key, bool) else str(key)
            if key in out:
                self.source.marks[(*path, key)] = _mark(key_node)
                self.problems.append(Problem(
                    (*path, key), f"duplicate key '{key}' (an earlier one is overridden)"))
                continue
            self.source.marks[(*path, key)] = _mark(key_node)
            out[key] = self.build(value_node, (*path, key))
        return out


def load_yaml(path: Path, environ: dict[str, str] | None = None) -> tuple[Any, SourceMap, list[Problem]]:
    """Parse `path`; raise YamlSyntaxError for unreadable or malformed YAML."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise YamlSyntaxError(f"cannot read the file: {exc.strerror}", None) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlSyntaxError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "a fleet file must be YAML text", Mark(line, 1)) from exc
    source = SourceMap(str(path))
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        detail = " ".join(p for p in (exc.context, exc.problem) if p)
        if "\t" in text and "'\\t'" in str(exc):
            detail += " (tabs are not allowed for indentation in YAML; use spaces)"
        raise YamlSyntaxError(
            f"invalid YAML: {detail}", Mark(mark.line + 1, mark.column + 1) if mark else None
        ) from exc
    except yaml.YAMLError as exc:  # ReaderError: control characters, binary data
        position = getattr(exc, "position", 0)
        line = text.count("\n", 0, position) + 1
        raise YamlSyntaxError(f"invalid YAML: {exc}".splitlines()[0], Mark(line, 1)) from exc
    if node is None:
        return None, source, []
    builder = _Builder(source, dict(os.environ) if environ is None else environ)
    data = builder.build(node, ())
    return data, source, builder.problems
