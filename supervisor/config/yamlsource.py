"""YAML that remembers where every value came from.

PyYAML's composer gives nodes with start marks; we build plain Python values from
those nodes ourselves and keep a side table from dotted path to (line, column), so
that every later error (schema, cross-check, backend check) can name the line.
We also refuse what PyYAML silently accepts: duplicate keys (the last one wins,
which hides typos), mappings or lists used as keys, tags other than the standard ones,
and NUL characters (no path, argument or environment value can hold one).

A fleet file is hand-written, so hostile YAML is refused within bounded time and memory
by the limits below (docs/fleet-file.md lists them): the file's size, nesting depth,
values produced by aliases (a recursive alias or a "billion laughs" bomb), the length of
one value and of one number.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.sourcemap import MISSING, Mark, Path_, Problem, SourceMap, dotted

__all__ = ["MISSING", "Mark", "Path_", "Problem", "SourceMap", "YamlSyntaxError", "dotted", "expand_env",
           "load_yaml"]


# Limits; each one is far above what a hand-written fleet file needs.
MAX_FILE_BYTES = 1024 * 1024  # 1 MiB: a 30-target file with comments is ~20 KB
MAX_DEPTH = 64  # nesting levels; the schema's deepest key is 5 levels down
MAX_ALIAS_VALUES = 10_000  # values produced by expanding aliases (`*name`, `<<: *name`)
MAX_ALIAS_CHARS = MAX_FILE_BYTES  # characters of the text those values hold
MAX_VALUES = 100_000  # values in the whole document, aliases expanded
MAX_SCALAR_CHARS = 64 * 1024  # one value: room for an inline chat template in args
MAX_NUMBER_CHARS = 100  # one number: 2**64 has 20 digits

_STANDARD_TAGS = {f"tag:yaml.org,2002:{t}" for t in (
    "str", "int", "float", "bool", "null", "map", "seq", "merge", "timestamp", "value")}
_NUL = "contains a NUL character (\\0), which no path, argument or environment value can hold"
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


class YamlSyntaxError(Exception):
    """YAML that cannot be read, or is over a limit; `path` is where, when it is known."""

    def __init__(self, message: str, mark: Mark | None, path: Path_ | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark
        self.path = path


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


def _mark(node: yaml.Node | yaml.Event) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def _show_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") \
        else tag


class _AliasNode(yaml.Node):
    """`*name` where it is written; PyYAML would hand back the anchored node itself, so
    that neither a cycle nor the size of an expansion could be seen."""

    id = "alias"

    def __init__(self, target: yaml.Node, event: yaml.AliasEvent) -> None:
        super().__init__(target.tag, target, event.start_mark, event.end_mark)
        self.anchor = event.anchor


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader's composer with a nesting limit, keeping aliases visible."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            return _AliasNode(super().compose_node(parent, index), event)
        self._depth += 1
        self._nodes += 1
        try:
            if self._nodes > MAX_VALUES:  # counted here too, to stop before composing them all
                raise YamlSyntaxError(f"more than {MAX_VALUES} values (the limit for a fleet "
                                      "file)", _mark(self.peek_event()))
            if self._depth > MAX_DEPTH:
                raise YamlSyntaxError(
                    f"nested more than {MAX_DEPTH} levels deep (the limit for a fleet file)",
                    _mark(self.peek_event()))
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class _Builder:
    def __init__(self, source: SourceMap, environ: dict[str, str]) -> None:
        self.source = source
        self.environ = environ
        self.problems: list[Problem] = []
        self._scalars = yaml.SafeLoader("")  # only its scalar constructors are used
        self._open: dict[int, yaml.Node] = {}  # collections being built: a cycle's test
        self._alias: _AliasNode | None = None  # the outermost alias being expanded
        self._alias_path: Path_ = ()
        self._values = 0
        self._alias_values = 0
        self._alias_chars = 0

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.source.marks.setdefault(path, _mark(node))
        self._count(node, path)
        if isinstance(node, _AliasNode):
            return self._expand(node, path)
        self._check_tag(node, path)
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            self._open[id(node)] = node
            try:
                if isinstance(node, yaml.MappingNode):
                    return self._mapping(node, path)
                return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
            finally:
                del self._open[id(node)]
        value = self._scalar(node, path)
        if isinstance(value, str) and "\0" in value:
            self.problems.append(Problem(path, _NUL))
        return value

    def _check_tag(self, node: yaml.Node, path: Path_) -> None:
        if node.tag not in _STANDARD_TAGS:
            self.problems.append(Problem(path, (
                f"unsupported YAML tag {_show_tag(node.tag)}: a fleet file takes only plain "
                "values (and the standard tags !!str, !!int, !!float, !!bool, !!null, !!map, "
                "!!seq); remove the tag")))

    def _count(self, node: yaml.Node, path: Path_) -> None:
        self._values += 1
        if self._values > MAX_VALUES:
            raise YamlSyntaxError(f"more than {MAX_VALUES} values (the limit for a fleet file, "
                                  "aliases expanded)", _mark(self._alias or node), path)
        if self._alias is not None:
            self._alias_values += 1
            if isinstance(node, yaml.ScalarNode):
                self._alias_chars += len(str(node.value))
            if self._alias_chars > MAX_ALIAS_CHARS:
                raise YamlSyntaxError(
                    f"aliases expand to more than {MAX_ALIAS_CHARS} characters (the limit for a "
                    f"fleet file); *{self._alias.anchor} is expanded here", _mark(self._alias),
                    self._alias_path)
            if self._alias_values > MAX_ALIAS_VALUES:
                raise YamlSyntaxError(
                    f"aliases expand to more than {MAX_ALIAS_VALUES} values (the limit for a "
                    f"fleet file); *{self._alias.anchor} is expanded here", _mark(self._alias),
                    self._alias_path)

    def _expand(self, alias: _AliasNode, path: Path_) -> Any:
        target = alias.value
        if id(target) in self._open:
            where = _mark(target)
            raise YamlSyntaxError(
                f"recursive alias: *{alias.anchor} refers to &{alias.anchor} (line {where.line}), "
                "which contains it", _mark(alias), path)
        outermost = self._alias is None
        if outermost:
            self._alias, self._alias_path = alias, path
        try:
            return self.build(target, path)
        finally:
            if outermost:
                self._alias = None

    def _scalar(self, node: yaml.Node, path: Path_) -> Any:
        text = str(node.value)
        if len(text) > MAX_SCALAR_CHARS:
            raise YamlSyntaxError(f"a value of {len(text)} characters; at most "
                                  f"{MAX_SCALAR_CHARS} (the limit for a fleet file)", _mark(node),
                                  path)
        if node.tag in _NUMBER_TAGS and len(text) > MAX_NUMBER_CHARS:
            raise YamlSyntaxError(f"a number of {len(text)} characters ({text[:20]}...); at most "
                                  f"{MAX_NUMBER_CHARS} (the limit for a fleet file)", _mark(node),
                                  path)
        value = self._construct(node, path)
        if isinstance(value, str) and "$" in value:
            value, missing = expand_env(value, self.environ)
            for name in missing:
                self.problems.append(Problem(
                    path, f"environment variable {name} is not set "
                          f"(write ${{{name}:-default}} to give a default)"))
        return value

    def _construct(self, node: yaml.Node, path: Path_) -> Any:
        """The scalar's value; a tag refused in build() or an invalid value is kept as text."""
        if node.tag not in _STANDARD_TAGS or node.tag == "tag:yaml.org,2002:value":
            return str(node.value)
        try:
            return self._scalars.construct_object(node)
        except (ValueError, OverflowError, yaml.YAMLError) as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            self.problems.append(Problem(path, f"{str(node.value)[:60]!r} is not a valid "
                                         f"{_show_tag(node.tag)}: {problem}"))
            return str(node.value)

    def _key(self, key_node: yaml.Node, path: Path_) -> str | None:
        if isinstance(key_node, _AliasNode):
            key_node = key_node.value
        if not isinstance(key_node, yaml.ScalarNode):
            kind, shown = ("mapping", "{...}") if isinstance(key_node, yaml.MappingNode) \
                else ("list", "[...]")
            self.source.marks.setdefault((*path, shown), _mark(key_node))
            self.problems.append(Problem((*path, shown), f"a {kind} is used as a key; a key is "
                                         "a name (text)"))
            return None
        key = self._scalar(key_node, path)
        if not isinstance(key, str):
            # Unquoted `8080:` or `yes:` become int/bool keys; names are always strings here.
            key = str(key).lower() if isinstance(key, bool) else str(key)
        if "\0" in key:
            key = key.replace("\0", "\\0")  # shown escaped; the problem makes it an error
            self.problems.append(Problem((*path, key), "this key " + _NUL))
        self._check_tag(key_node, (*path, key))
        return key

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
            key = self._key(key_node, path)
            if key is None:
                continue
            self.source.marks[(*path, key)] = _mark(key_node)  # the key's problems point here
            if key in out:
                self.problems.append(Problem(
                    (*path, key), f"duplicate key '{key}' (an earlier one is overridden)"))
                continue
            out[key] = self.build(value_node, (*path, key))
        return out


def _read_text(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YamlSyntaxError(f"cannot read the file: {exc.strerror}", None) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise YamlSyntaxError(f"the file is larger than {MAX_FILE_BYTES // 1024} KiB (the limit "
                              "for a fleet file)", None)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlSyntaxError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "a fleet file must be YAML text", Mark(line, 1)) from exc


_UNCLOSED = {"while parsing a flow sequence": "the '[' opened here is not closed",
             "while parsing a flow mapping": "the '{' opened here is not closed",
             "while scanning a quoted scalar": "the quote opened here is not closed"}


def _syntax_error(exc: yaml.MarkedYAMLError, text: str) -> YamlSyntaxError:
    mark = exc.problem_mark or exc.context_mark
    if exc.context in _UNCLOSED and exc.context_mark is not None and exc.problem_mark is not None:
        # Reported where the bracket or quote opened; PyYAML's mark is where it gave up.
        mark = exc.context_mark
        detail = f"{_UNCLOSED[exc.context]}: {exc.problem} at line {exc.problem_mark.line + 1}"
    else:
        detail = " ".join(p for p in (exc.context, exc.problem) if p)
    if "\t" in text and "'\\t'" in str(exc):
        detail += " (tabs are not allowed for indentation in YAML; use spaces)"
    return YamlSyntaxError(f"invalid YAML: {detail}",
                           Mark(mark.line + 1, mark.column + 1) if mark else None)


def _compose(text: str) -> yaml.Node | None:
    loader = None
    try:
        loader = _LimitedLoader(text)
        return loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, text) from exc
    except yaml.YAMLError as exc:  # ReaderError: control characters, binary data
        position = getattr(exc, "position", 0)
        line = text.count("\n", 0, position) + 1
        raise YamlSyntaxError(f"invalid YAML: {exc}".splitlines()[0], Mark(line, 1)) from exc
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: Path, environ: dict[str, str] | None = None) -> tuple[Any, SourceMap, list[Problem]]:
    """Parse `path`; raise YamlSyntaxError for unreadable or malformed YAML, or YAML over
    one of the limits above."""
    source = SourceMap(str(path))
    node = _compose(_read_text(path))
    if node is None:
        return None, source, []
    builder = _Builder(source, dict(os.environ) if environ is None else environ)
    data = builder.build(node, ())
    return data, source, builder.problems
