"""Each target's history for the status page (docs/ui.md): its shown quantities (tokens/s,
acceptance rate, mean accepted length, draft length) at every new reading of its counters,
and marks for what happened (starts, crashes, loads and unloads, tuning decisions).

Bounded twice: `keep` seconds (24 h) and `max_points` samples and `max_marks` marks per target
(a mark is a dict of ~440 bytes, and a target that swaps on demand every few seconds makes
a thousand an hour: a daemon grows by them for hours under a bound of thousands; a day's
chart cannot show more than a few hundred apart anyway; events.jsonl has them, up to its
rotation),
in memory (samples in compact columns: samples.py) and in <state_dir>/history/<target>.jsonl,
which is appended to and rewritten from memory when its samples or its marks have grown to
twice what is kept of them (counted apart: a swapping target's marks would otherwise fill
40,000 lines, all parsed by the next daemon to keep 500). The next daemon reads the file a
line at a time. A line that cannot be written (a full disk) is reported to `report`, never
raised; a line that cannot be read is skipped.
"""

from __future__ import annotations

import collections
import heapq
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from supervisor.atomicfile import LOG_ONLY, StateReport, write_text
from supervisor.daemon.samples import Samples
from supervisor.events import Event

SAMPLED = ("tokens_per_second", "acceptance_rate", "mean_accepted_length", "draft_length")
# How the page labels each chart and its y-axis: the unit and the factor from the sampled
# value to the shown one (acceptance is sampled as a share, shown as a percentage).
SERIES = ({"key": "tokens_per_second", "label": "Speed", "unit": "tok/s", "scale": 1},
          {"key": "acceptance_rate", "label": "Acceptance", "unit": "%", "scale": 100},
          {"key": "mean_accepted_length", "label": "Mean accepted length",
           "unit": "tokens/step", "scale": 1},
          {"key": "draft_length", "label": "Draft length", "unit": "tokens", "scale": 1})
# Events that become marks on the time axis; state changes only into these states.
MARK_KINDS = frozenset({"tuning", "load"})
MARK_STATES = frozenset({"starting", "backoff", "waiting", "failed", "unloaded", "stopped"})


class History:
    def __init__(self, directory: Path, keep: float = 24 * 3600, max_points: int = 20_000,
                 max_marks: int = 500,
                 report: StateReport = LOG_ONLY,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.keep = keep
        self.max_points = max_points
        self.max_marks = max_marks
        self.report = report
        self.clock = clock
        self._samples: dict[str, Samples] = {}
        self._marks: dict[str, collections.deque[dict[str, Any]]] = {}
        # Lines of samples and of marks in each file (what was rewritten, appended since).
        self._written: dict[str, collections.Counter[str]] = {}

    # --- recording ---

    def sample(self, target: str, shown: dict[str, Any], when: float | None = None) -> None:
        values = {k: shown.get(k) for k in SAMPLED}
        if all(v is None for v in values.values()):
            return
        self._add(target, {"t": round(when or self.clock(), 3), "s": values})

    def mark(self, event: Event) -> None:
        """An event worth a mark on the target's charts (others are ignored)."""
        if event.target in ("", "-") or not (
                event.kind in MARK_KINDS
                or (event.kind == "state" and event.new in MARK_STATES and event.old)
                # A restart beside the old server changes no state: its start is the mark.
                or (event.kind == "replace" and event.data.get("replace") == "beside")):
            return
        mark = {"kind": event.kind, "reason": event.reason}
        if event.new:
            mark["state"] = event.new
        if event.data:
            mark["data"] = event.data
        self._add(event.target, {"t": round(event.time, 3), "m": mark})

    def _add(self, target: str, point: dict[str, Any]) -> None:
        self._load(target)
        if "s" in point:
            self._samples[target].append(point["t"], point["s"])
        else:
            self._marks[target].append(point)
        self._trim(target)
        path = self._path(target)
        line = json.dumps(point) + "\n"
        kind, written = ("s" if "s" in point else "m"), self._written[target]
        if written[kind] + 1 > 2 * (self.max_points if kind == "s" else self.max_marks):
            self.report.attempt(path.name, lambda: self._rewrite(target))
        elif self.report.attempt(path.name, lambda: _append(path, line)):
            written[kind] += 1

    def _points(self, target: str) -> list[dict[str, Any]]:
        """Samples and marks as the file holds them, in time order."""
        samples = ({"t": t, "s": values} for t, values in self._samples[target])
        return list(heapq.merge(samples, self._marks[target], key=lambda p: p["t"]))

    def _rewrite(self, target: str) -> None:
        points = self._points(target)
        write_text(self._path(target), "".join(json.dumps(p) + "\n" for p in points))
        self._written[target] = collections.Counter(s=len(self._samples[target]),
                                                    m=len(self._marks[target]))

    def _trim(self, target: str) -> None:
        oldest = self.clock() - self.keep
        self._samples[target].drop_before(oldest)
        marks = self._marks[target]
        while marks and marks[0]["t"] < oldest:
            marks.popleft()

    # --- reading ---

    def _path(self, target: str) -> Path:
        return self.directory / f"{target}.jsonl"

    def _load(self, target: str) -> None:
        """The target's history from its file, the first time it is asked for."""
        if target in self._samples:
            return
        self._samples[target] = samples = Samples(SAMPLED, self.max_points,
                                                  integral=frozenset({"draft_length"}))
        self._marks[target] = marks = collections.deque(maxlen=self.max_marks)
        self._written[target] = written = collections.Counter()
        for p in _read(self._path(target)):
            if isinstance(p.get("s"), dict):
                samples.append(p["t"], p["s"])
                written["s"] += 1
            elif isinstance(p.get("m"), dict):
                marks.append(p)
                written["m"] += 1
        self._trim(target)

    def view(self, target: str, since: float | None = None) -> dict[str, Any]:
        """{"samples": [{"t", ...quantities}], "marks": [{"t", "kind", "reason", ...}],
        "series": how each quantity is labelled}"""
        self._load(target)
        samples = [{"t": t, **values} for t, values in self._samples[target]
                   if since is None or t > since]
        marks = [{"t": p["t"], **p["m"]} for p in self._marks[target]
                 if since is None or p["t"] > since]
        return {"target": target, "keep_s": self.keep, "series": list(SERIES),
                "samples": samples, "marks": marks}


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)


def _read(path: Path) -> Iterator[dict[str, Any]]:
    """The file's points, a line at a time (a whole file at once was a transient peak of
    megabytes at every daemon start, which the allocator keeps)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    point = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash
                if isinstance(point, dict) and isinstance(point.get("t"), int | float):
                    yield point
    except OSError:
        return  # no file yet, or unreadable: no history
