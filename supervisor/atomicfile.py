"""Write files so that a reader never sees half a file: a temporary file, then rename.

Also what every writer of the daemon's state dir shares: `StateReport`, where a write that
failed (a full or read-only disk) and a state file found corrupt are reported instead of
raised (the daemon's is `supervisor.daemon.statedir.StateDirHealth`; elsewhere `LOG_ONLY`),
and `read_state`, which reads a JSON state file and sets a corrupt one aside.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text`; the file is created with `mode` from the start (a secret
    written 0600 is never readable by others, not even for a moment). On any failure the
    temporary file is removed and `path` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)  # O_CREAT's mode is reduced by the umask
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json(path: Path, data: Any, indent: int | None = None) -> None:
    write_text(path, json.dumps(data, indent=indent))


class StateReport(Protocol):
    """Where writers of the state dir report instead of raising."""

    def attempt(self, what: str, write: Callable[[], None]) -> bool:
        """Run `write` (which writes the writer's current state to the file `what`); an
        OSError is reported, and `write` may be called again later (a retry). True if
        it succeeded."""
        ...

    def corrupt(self, path: Path, kept: Path | None, error: str) -> None:
        """`path` could not be read as state (`error`); it was moved to `kept` (None: it
        could not be moved) and the writer goes on with empty state."""
        ...


class LogOnly:
    """The report of writers outside the daemon: a failure is logged, never raised."""

    log = logging.getLogger("specfleet")

    def attempt(self, what: str, write: Callable[[], None]) -> bool:
        try:
            write()
        except OSError as exc:
            self.log.warning("cannot write %s: %s", what, exc)
            return False
        return True

    def corrupt(self, path: Path, kept: Path | None, error: str) -> None:
        self.log.warning("%s", corrupt_message(path, kept, error))


LOG_ONLY = LogOnly()


def corrupt_message(path: Path, kept: Path | None, error: str) -> str:
    where = f"kept as {kept.name}" if kept is not None else "it could not be moved aside"
    return f"{path.name} in {path.parent} is corrupt ({error}): {where}; going on without it"


def set_aside(path: Path) -> Path | None:
    """Move a corrupt state file to `<name>.corrupt-<timestamp>`; None if it cannot be."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(100):
        kept = path.with_name(f"{path.name}.corrupt-{stamp}" + (f".{n}" if n else ""))
        if kept.exists():
            continue
        try:
            path.rename(kept)
        except OSError:
            return None
        return kept
    return None


def read_state(path: Path, report: StateReport) -> dict[str, Any]:
    """A JSON object kept in the state dir; {} when there is none or it cannot be read. One
    that is not a UTF-8 JSON object is set aside (`set_aside`) and reported."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        report.corrupt(path, None, f"unreadable: {exc.strerror or exc}")
        return {}
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        error = "not UTF-8 text"
    except ValueError as exc:
        error = f"not JSON: {exc}"
    else:
        if isinstance(data, dict):
            return data
        error = f"a JSON {type(data).__name__}, not an object"
    report.corrupt(path, set_aside(path), error)
    return {}
