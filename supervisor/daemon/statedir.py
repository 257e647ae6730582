"""Whether the daemon can write its state dir: the one place every writer of it reports to.

A write that fails (a full or read-only disk) never reaches a target's owner task: the
writer reports it here and goes on. The first failure is an event (and so a log line), the
daemon block of `/healthz`, `/v1/targets` and status.json says "state dir not writable: …",
each failed write is tried again at every status refresh (the writer's `write` writes its
current state, so a retry catches up), and when the last one succeeds that is one event
more. A state file found corrupt is reported once, with where its copy was kept.

Writers may report from a worker thread (the run records' digests): what changes here then
happens on the daemon's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.atomicfile import corrupt_message

Emit = Callable[..., None]  # (kind, reason, detail=None, data=None): a daemon event


class StateDirHealth:
    """The daemon's `StateReport` (supervisor.atomicfile)."""

    def __init__(self, state_dir: Path, emit: Emit) -> None:
        self.state_dir = state_dir
        self._emit = emit
        self._failing: dict[str, tuple[OSError, Callable[[], None]]] = {}
        self._corrupt_seen: set[Path] = set()
        self.loop: asyncio.AbstractEventLoop | None = None  # the daemon's, for threads

    def on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The daemon's loop, where reports from worker threads are handed."""
        self.loop = loop

    @property
    def problem(self) -> str | None:
        """"state dir not writable: <error> (…)" while a write is failing, else None."""
        if not self._failing:
            return None
        what, (exc, _) = next(iter(self._failing.items()))
        return (f"state dir not writable: {exc.strerror or exc} (writing {what} in "
                f"{self.state_dir})")

    def attempt(self, what: str, write: Callable[[], None]) -> bool:
        try:
            write()
        except OSError as exc:
            self._on_loop(self._failed, what, exc, write)
            return False
        self._on_loop(self._wrote, what)
        return True

    def retry(self) -> None:
        """Try every failed write again (the daemon calls this at each status refresh)."""
        for what, (_, write) in list(self._failing.items()):
            if what in self._failing:
                self.attempt(what, write)

    def corrupt(self, path: Path, kept: Path | None, error: str) -> None:
        self._on_loop(self._corrupt, path, kept, error)

    def _failed(self, what: str, exc: OSError, write: Callable[[], None]) -> None:
        first = not self._failing
        self._failing[what] = (exc, write)
        if first:
            self._emit("daemon", f"{self.problem}; running targets are not affected, and "
                       "what could not be written is retried at each status refresh",
                       data={"file": what, "error": str(exc), "level": "warning"})

    def _wrote(self, what: str) -> None:
        if self._failing.pop(what, None) is not None and not self._failing:
            self._emit("daemon", f"state dir {self.state_dir} writable again: every write "
                       "that had failed is done", data={"file": what})

    def _corrupt(self, path: Path, kept: Path | None, error: str) -> None:
        if path in self._corrupt_seen:
            return
        self._corrupt_seen.add(path)
        self._emit("daemon", corrupt_message(path, kept, error),
                   data={"file": path.name, "kept": str(kept) if kept else None,
                         "level": "warning"})

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread (or no loop at all)
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(fn, *args)
                return
        fn(*args)
