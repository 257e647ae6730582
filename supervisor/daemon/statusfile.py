"""The daemon's status, written to <state_dir>/status.json for `specfleet status`.

Written atomically (temp file, then rename) so a reader never sees half a file.
It says which daemon wrote it, so a reader can tell a live daemon from a stale file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.atomicfile import write_text
from supervisor.launcher import processstamp

if TYPE_CHECKING:  # `specfleet status` reads the file without the daemon's modules
    from supervisor.supervision.status import TargetStatus

STATUS_FILE = "status.json"


def write(state_dir: Path, daemon: dict[str, Any], targets: list[TargetStatus]) -> None:
    # Each status as its own field dict, encoded compactly: `dataclasses.asdict` (a deep
    # copy) and the indenting encoder (pure Python) were 85 % of the ~3 ms of CPU that this
    # cost every 5 s with 8 targets. What is written is the same JSON.
    write_text(state_dir / STATUS_FILE, json.dumps(
        {"daemon": daemon, "targets": [vars(t) for t in targets]}, default=_nested))


def _nested(value: object) -> object:
    """A dataclass inside a status (json.dumps asks only for what it cannot encode)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} in a status is not JSON")


def read(state_dir: Path, warn: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """The status a daemon wrote; None when there is none, or when it is unreadable (not
    UTF-8 JSON, or not shaped as a status): then `warn` is told so, in one sentence."""
    path = state_dir / STATUS_FILE
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except ValueError as exc:
        problem = f"not JSON: {exc}"
    except OSError as exc:
        problem = exc.strerror or str(exc)
    else:
        problem = _shape_problem(data)
        if problem is None:
            return data
    if warn is not None:
        warn(f"the status file {path} is unreadable ({problem}); treating it as no status")
    return None


def _shape_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    if not isinstance(data.get("daemon", {}), dict):
        return "its daemon block is not an object"
    targets = data.get("targets", [])
    if not isinstance(targets, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str)
            and isinstance(t.get("state"), str) for t in targets):
        return "its targets are not a list of targets with a name and a state"
    return None


def daemon_alive(daemon: dict[str, Any]) -> bool:
    """The writing daemon is still running (same pid, boot and start)."""
    return processstamp.same_process(daemon)
