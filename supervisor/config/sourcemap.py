"""Where the values of a fleet file were written, and the problem type that names them:
every error (schema, cross-check, backend or launcher check) is a `Problem` at a dotted
path, which the `SourceMap` turns into a line and column."""

from __future__ import annotations

from dataclasses import dataclass, field

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


# What this host lacks for one target now, not what the file says: a model or draft file
# that is missing, unreadable or truncated, a runtime binary that is not there. An error at
# `check`; at `run` and at a reload that target alone waits for it (supervision/waiting.py)
# and the rest start, as systemd treats one unit's failure as that unit's.
MISSING = "missing"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the fleet file, located by dotted path."""

    path: Path_
    message: str
    severity: str = "error"  # "warning", or MISSING


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"
