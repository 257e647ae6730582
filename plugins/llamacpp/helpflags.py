"""The flags a llama-server build accepts, read from its own `--help`, and every flag of a
command line checked against them (pure: the help text in, problems out).

llama.cpp renames flags often (the speculative ones twice in 2026) and rejects an unknown
flag at start with its usage text. Its `--help` (common/arg.cpp's printer) lists each
option as one entry: the spellings, comma-separated, then a value placeholder where it
takes one (`-c,    --ctx-size N`), and from column 40 on its description, which for a flag
that is gone says "the argument has been removed. use ..." and for one on its way out
"(DEPRECATED)" (b10405: "DEPRECATED in favor of ..."). A flag that is in no entry is not
one of this build's. A value placeholder that lists the values (`[on|off|auto]`, or
`none,draft-simple,...` for a list of them) names all the build takes: b9093's
`--spec-type` has no `draft-simple`, b11434's has.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

_REMOVED = "the argument has been removed."
# The spellings of one entry end where two spaces follow something that is not a comma
# ("-t,    --threads N      number of ..." -> "-t,    --threads N").
_LEFT_END = re.compile(r"(?<=[^,\s])\s{2,}")
_FLAG = re.compile(r"^--?[A-Za-z][\w.-]*$")
_NUMBER = re.compile(r"^-\d|^-\.\d")
_WORD = r"[a-z][a-z0-9-]*"
_ONE_OF = re.compile(rf"^\[({_WORD}(?:\|{_WORD})+)\]$")  # [on|off|auto]: one of them
_SOME_OF = re.compile(rf"^({_WORD}(?:,{_WORD})+)$")  # none,draft-simple,...: a list of them


@dataclass(frozen=True)
class HelpFlags:
    """What one build's `--help` says of its flags."""

    takes_value: dict[str, bool] = field(default_factory=dict)  # every flag it lists
    removed: dict[str, str] = field(default_factory=dict)  # flag -> what the help says instead
    deprecated: frozenset[str] = frozenset()
    # flag -> (the values it takes, whether a comma-separated list of them)
    choices: dict[str, tuple[tuple[str, ...], bool]] = field(default_factory=dict)

    def why_not_value(self, flag: str, value: str) -> str | None:
        """Why `value` cannot follow `flag` (not among the values its help lists)."""
        if flag not in self.choices:
            return None
        values, many = self.choices[flag]
        given = value.split(",") if many else [value]
        bad = [v for v in given if v not in values]
        if not bad:
            return None
        return f"does not take {bad[0]!r} (its values: {', '.join(values)})"

    def why_not(self, flag: str) -> str | None:
        """Why `flag` cannot be given to this build (removed, or not listed); None: fine."""
        if flag in self.removed:
            instead = self.removed[flag]
            return "is listed as removed" + (f": {instead}" if instead else "")
        if flag not in self.takes_value:
            close = difflib.get_close_matches(flag, list(self.takes_value), n=1, cutoff=0.85)
            return "is not one of its flags" + (f" (did you mean {close[0]}?)" if close else "")
        return None


def parse_help(text: str) -> HelpFlags:
    """The flags of a llama-server `--help` text."""
    takes_value: dict[str, bool] = {}
    removed: dict[str, str] = {}
    deprecated: set[str] = set()
    choices: dict[str, tuple[tuple[str, ...], bool]] = {}
    entries: list[tuple[list[str], bool, list[str]]] = []  # (flags, takes a value, description)
    for line in text.splitlines():
        if line.startswith("-"):
            left, description = _split(line)
            words = [w.rstrip(",") for w in left.split()]
            flags = [w for w in words if _FLAG.match(w)]
            if flags:
                entries.append((flags, len(flags) < len(words), [description]))
                placeholders = [w for w in words if not _FLAG.match(w)]
                if len(placeholders) == 1 and (m := _ONE_OF.match(placeholders[0])
                                               or _SOME_OF.match(placeholders[0])):
                    many = "," in m.group(1)
                    for flag in flags:
                        choices[flag] = (tuple(m.group(1).split("," if many else "|")), many)
        elif entries and line.startswith(" ") and line.strip():
            entries[-1][2].append(line.strip())
    for flags, value, description in entries:
        said = " ".join(d for d in description if d)
        for flag in flags:
            takes_value[flag] = value
        if said.lower().startswith(_REMOVED):
            instead = said[len(_REMOVED):].split("(env:")[0].strip()
            for flag in flags:
                removed[flag] = instead
        elif "(DEPRECATED)" in said or said.startswith("DEPRECATED"):  # b11434's, b10405's
            deprecated.update(flags)
    return HelpFlags(takes_value, removed, frozenset(deprecated), choices)


def _split(line: str) -> tuple[str, str]:
    """An entry's first line: (its spellings and placeholder, the start of its description)."""
    parts = _LEFT_END.split(line, maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def flags_of(argv: Sequence[str], help_flags: HelpFlags) -> list[tuple[int, str]]:
    """(index, flag) of each flag on a command line (after the program): a value that
    follows a flag taking one is skipped, `--flag=value` counts as `--flag`, and a
    negative number is a value."""
    out: list[tuple[int, str]] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if not arg.startswith("-") or _NUMBER.match(arg) or arg == "-":
            continue
        flag, eq, _ = arg.partition("=")
        out.append((i, flag))
        skip = not eq and help_flags.takes_value.get(flag, False)
    return out


def flag_problems(argv: Sequence[str], help_flags: HelpFlags) -> list[tuple[int, str, str]]:
    """(index, flag, why) of each flag on `argv` this build does not take, or whose value
    is not one its help lists."""
    out = []
    for i, flag in flags_of(argv, help_flags):
        why = help_flags.why_not(flag)
        if why is None and flag in help_flags.choices:
            _, eq, value = argv[i].partition("=")
            if not eq and i + 1 < len(argv):
                value = argv[i + 1]
            why = help_flags.why_not_value(flag, value) if (eq or i + 1 < len(argv)) else None
        if why is not None:
            out.append((i, flag, why))
    return out
