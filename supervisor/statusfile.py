"""The daemon's status, written to <state_dir>/status.json for `specfleet status`.

Written atomically (temp file, then rename) so a reader never sees half a file.
It says which daemon wrote it, so a reader can tell a live daemon from a stale file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from supervisor.target import TargetStatus

STATUS_FILE = "status.json"


def write(state_dir: Path, daemon: dict[str, Any], targets: list[TargetStatus]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATUS_FILE
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"daemon": daemon, "targets": [asdict(t) for t in targets]},
                              indent=1))
    tmp.replace(path)


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
