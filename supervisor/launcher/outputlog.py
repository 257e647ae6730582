"""A target's output: the rotating log file on disk and the last lines in memory, shared by
every launcher that reads a runtime's output itself (process, container, Ray)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from logging.handlers import RotatingFileHandler
from pathlib import Path

TAIL_LINES = 200


class _DroppingHandler(RotatingFileHandler):
    """A line that cannot be written (a full disk) is dropped from the file, quietly:
    logging's default prints a traceback per line to the daemon's stderr. The line stays in
    the in-memory tail, and the state dir's health is reported by the state files' writers."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class OutputLog:
    """A target's stdout+stderr: a rotating file on disk and the last lines in memory."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._handler: RotatingFileHandler | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = _DroppingHandler(path, maxBytes=max_bytes, backupCount=backups,
                                             encoding="utf-8")
        except OSError:  # a full or read-only disk must not stop the target from starting
            return
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, line: str, keep: bool = True) -> None:
        if keep:
            self.tail.append(line)
        if self._handler is not None:
            self._handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))

    def close(self) -> None:
        if self._handler is not None:
            with contextlib.suppress(OSError):  # its last buffered lines, on a full disk
                self._handler.close()


async def pump(stream: asyncio.StreamReader, log: OutputLog,
               on_line: Callable[[str], None] | None) -> None:
    """Each line of a runtime's output into its log (and to `on_line`) until EOF."""
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip("\n")
        log.write(text)
        if on_line is not None:
            on_line(text)
