"""The daemon's status, written to <state_dir>/status.json for `specfleet status`.

Written atomically (temp file, then rename) so a reader never sees half a file.
It says which daemon wrote it, so a reader can tell a live daemon from a stale file.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from supervisor.atomicfile import write_json
from supervisor.target.status import TargetStatus

STATUS_FILE = "status.json"


def write(state_dir: Path, daemon: dict[str, Any], targets: list[TargetStatus]) -> None:
    write_json(state_dir / STATUS_FILE,
               {"daemon": daemon, "targets": [asdict(t) for t in targets]}, indent=1)


def read(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((state_dir / STATUS_FILE).read_text())
    except FileNotFoundError:
        return None


def daemon_alive(daemon: dict[str, Any]) -> bool:
    """The writing daemon is still running (same pid and start time)."""
    try:
        proc = psutil.Process(int(daemon["pid"]))
        return abs(proc.create_time() - float(daemon["create_time"])) < 0.01
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False
