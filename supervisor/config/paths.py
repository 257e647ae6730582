"""Default locations on this host, apart from the schema so that `specfleet status` can
show and use them without loading pydantic."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> str:
    """`/var/lib/specfleet` as root, else `$XDG_STATE_HOME/specfleet` (`~/.local/state/specfleet`)"""
    if os.geteuid() == 0:
        return "/var/lib/specfleet"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "specfleet")
