"""Events: every state transition and decision, with its reason, fanned out to subscribers."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from supervisor.atomicfile import LOG_ONLY, StateReport, set_aside


@dataclass(frozen=True)
class Event:
    target: str
    kind: str  # "state", "reload", "daemon", ...
    reason: str
    old: str | None = None
    new: str | None = None
    detail: str | None = None  # e.g. the runtime's stderr tail
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn)

    def emit(self, event: Event) -> None:
        for fn in list(self._subscribers):
            fn(event)


class _RaisingHandler(RotatingFileHandler):
    """A rotating file whose write errors reach the caller (logging's default prints a
    traceback to stderr for each record and goes on)."""

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is not None:
            raise exc


class EventLog:
    """Every event as a JSON line in <state_dir>/events.jsonl (rotated at 10 MiB, 3 kept).

    A line that cannot be written (a full disk) is reported to `report`, never raised, and
    written when `report` retries (as far as the file's buffer holds it). A corrupt file
    (not UTF-8, or a line that is not a JSON object) is set aside before the first line is
    written, and reported."""

    def __init__(self, path: Path, report: StateReport = LOG_ONLY) -> None:
        self.path = path
        self.report = report
        self._checked = False
        self._handler = _RaisingHandler(path, maxBytes=10 * 1024 * 1024, backupCount=3,
                                        encoding="utf-8", delay=True)
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def append(self, event: Event) -> None:
        if not self._checked:
            self._checked = True
            self._set_aside_if_corrupt()
        record = logging.makeLogRecord({"msg": json.dumps(event.to_dict()),
                                        "levelno": logging.INFO})
        emitted = False

        def write() -> None:  # the first time the line; a retry flushes what the file holds
            nonlocal emitted
            if emitted:
                self._handler.flush()
            else:
                emitted = True
                self._handler.emit(record)

        self.report.attempt(self.path.name, write)

    def _set_aside_if_corrupt(self) -> None:
        """Binary garbage sets the whole file aside. Bad lines in a text file (a line torn
        by a crash or a full disk) do not cost the history: the original is kept aside and
        the file keeps its good lines."""
        try:
            text = self.path.read_bytes().decode()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            error = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
            self.report.corrupt(self.path, set_aside(self.path), error)
            return
        numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line]
        bad = {n for n, line in numbered if not _json_object(line)}
        if not bad:
            if text and not text.endswith("\n"):  # a last line whole but unterminated
                self.report.attempt(self.path.name, lambda: _append(self.path, "\n"))
            return
        good = [line for n, line in numbered if n not in bad]
        kept = set_aside(self.path)
        if kept is not None:  # else the original, good lines and all, is still there
            self.report.attempt(self.path.name,
                                lambda: _append(self.path, "".join(f"{ln}\n" for ln in good)))
        self.report.corrupt(self.path, kept, f"line {min(bad)} is not a JSON object; its "
                            f"{len(good)} good lines stay in {self.path.name}")

    def close(self) -> None:
        self._handler.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def _json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
