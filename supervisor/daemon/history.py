"""Each target's history for the status page (docs/ui.md): its shown quantities (tokens/s,
acceptance rate, mean accepted length, draft length) at every new reading of its counters,
and marks for what happened (starts, crashes, loads and unloads, tuning decisions).

Bounded twice: `keep` seconds (24 h) and `max_points` per target, in memory and in
<state_dir>/history/<target>.jsonl, which is appended to and rewritten from memory when
it has grown to twice what is kept. A line that cannot be written (a full disk) is
reported to `report`, never raised; a line that cannot be read is skipped.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from supervisor.atomicfile import LOG_ONLY, StateReport, write_text
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
MARK_STATES = frozenset({"starting", "backoff", "failed", "unloaded", "stopped"})


class History:
    def __init__(self, directory: Path, keep: float = 24 * 3600, max_points: int = 20_000,
                 report: StateReport = LOG_ONLY,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.keep = keep
        self.max_points = max_points
        self.report = report
        self.clock = clock
        self._points: dict[str, collections.deque[dict[str, Any]]] = {}
        self._written: dict[str, int] = {}  # lines in each file since it was last rewritten

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
        points = self._series(target)
        points.append(point)
        self._trim(points)
        path = self._path(target)
        line = json.dumps(point) + "\n"
        if self._written.get(target, 0) + 1 > 2 * self.max_points:
            self.report.attempt(path.name, lambda: self._rewrite(target))
        elif self.report.attempt(path.name, lambda: _append(path, line)):
            self._written[target] = self._written.get(target, 0) + 1

    def _rewrite(self, target: str) -> None:
        write_text(self._path(target), "".join(json.dumps(p) + "\n"
                                               for p in self._series(target)))
        self._written[target] = len(self._series(target))

    def _trim(self, points: collections.deque[dict[str, Any]]) -> None:
        oldest = self.clock() - self.keep
        while points and points[0]["t"] < oldest:
            points.popleft()

    # --- reading ---

    def _path(self, target: str) -> Path:
        return self.directory / f"{target}.jsonl"

    def _series(self, target: str) -> collections.deque[dict[str, Any]]:
        if target not in self._points:
            self._points[target] = points = collections.deque(maxlen=self.max_points)
            points.extend(_read(self._path(target)))
            self._trim(points)
            self._written[target] = len(points)
        return self._points[target]

    def view(self, target: str, since: float | None = None) -> dict[str, Any]:
        """{"samples": [{"t", ...quantities}], "marks": [{"t", "kind", "reason", ...}],
        "series": how each quantity is labelled}"""
        samples, marks = [], []
        for p in self._series(target):
            if since is not None and p["t"] <= since:
                continue
            if "s" in p:
                samples.append({"t": p["t"], **p["s"]})
            elif "m" in p:
                marks.append({"t": p["t"], **p["m"]})
        return {"target": target, "keep_s": self.keep, "series": list(SERIES),
                "samples": samples, "marks": marks}


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)


def _read(path: Path) -> Iterable[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            point = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        if isinstance(point, dict) and isinstance(point.get("t"), int | float):
            out.append(point)
    return out
