"""Events: every state transition and decision, with its reason, fanned out to subscribers."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any


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


class EventLog:
    """Every event as a JSON line in <state_dir>/events.jsonl (rotated at 10 MiB, 3 kept)."""

    def __init__(self, path: Path) -> None:
        self._handler = RotatingFileHandler(path, maxBytes=10 * 1024 * 1024, backupCount=3,
                                            encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def append(self, event: Event) -> None:
        line = json.dumps(event.to_dict())
        self._handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handler.close()
