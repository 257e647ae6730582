"""The FleetView the HTTP side reads (api/fleetview.py), over the daemon's fleet of
target supervisors: the adapter apart, so that daemon/fleet.py keeps one job (the
targets, their plan and reload). It also keeps the status page's list of recent requests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from supervisor.api import litellm
from supervisor.api.activity import RequestLog
from supervisor.api.keys import KeyRing
from supervisor.config.schema import Target
from supervisor.daemon.fleet import FleetSupervisors
from supervisor.events import Event
from supervisor.supervision import labels
from supervisor.supervision.served import Served
from supervisor.tuning import evidence


class FleetApi:
    def __init__(self, targets: FleetSupervisors) -> None:
        self.targets = targets
        self.activity = RequestLog()
        self._keys = KeyRing(lambda: self.targets.fleet)

    @property
    def fleet_file(self) -> str:
        return str(self.targets.fleet_path)

    def daemon_info(self) -> dict[str, Any]:
        info = self.targets.daemon_info()
        return {**info, "display": labels.daemon_display(info)}

    async def reload(self, by: str | None = None) -> tuple[bool, list[str]]:
        return await self.targets.reload(by)

    def target_statuses(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        now = time.time()
        statuses = [asdict(s.status()) for n, s in self.targets.supervisors.items()
                    if names is None or n in names]
        # The labels the CLI prints, for the page to show as they are (labels.py).
        return [{**s, "display": labels.display(s, now)} for s in statuses]

    def target_names(self) -> list[str]:
        return list(self.targets.supervisors)

    def served_target(self, name: str) -> Served | None:
        sup = self.targets.supervisors.get(name)
        return sup.served if sup is not None else None

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        return self.targets.events.subscribe(fn)

    def keyring(self) -> KeyRing:
        """The keys, each read from its source at every use (a rotated file takes effect)."""
        return self._keys

    def _export_info(self, target: Target) -> dict[str, Any]:
        return self.targets.registry.launcher_class(target).export_info(target)

    def litellm_config(self) -> dict[str, Any]:
        """The export; from the running daemon also the Ray node each target runs on now."""
        config = litellm.config(self.targets.fleet, self._export_info)
        for entry in config["model_list"]:
            sup = self.targets.supervisors.get(entry["model_name"])
            node = sup.placement.get("node") if sup is not None else None
            if node:
                entry["model_info"]["node"] = node
        return config

    # --- for the status page (docs/ui.md) ---

    def record_request(self, target: str, status: int, started: float, duration: float,
                       stream: bool, final: dict[str, Any] | None,
                       error: str | None = None, key: str | None = None) -> None:
        self.activity.record(target, status, started, duration, stream, final, error, key)

    def recent_requests(self, limit: int | None = None) -> list[dict[str, Any]]:
        return self.activity.recent(limit)

    def history(self, name: str, since: float | None = None) -> dict[str, Any]:
        return self.targets.histories.view(name, since)

    def tuning(self, name: str) -> dict[str, Any]:
        """Why the target runs its setting (tuning/evidence.py); {"enabled": False} untuned."""
        tuner = self.targets.supervisors[name].tuner
        if not tuner.active:
            return {"target": name, "enabled": False}
        return {"target": name, "enabled": True, **evidence.why(tuner.view(), tuner.memory)}

    def log_tail(self, name: str, lines: int) -> list[str]:
        """The last `lines` lines of the target's log file (its runtime's output)."""
        sup = self.targets.supervisors.get(name)
        if sup is None or not sup.log_file:
            return []
        return tail_lines(Path(sup.log_file), lines)


def tail_lines(path: Path, lines: int, chunk: int = 65536) -> list[str]:
    """The last `lines` lines of a file, reading only as much of its end as needed."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            data = b""
            while size > 0 and data.count(b"\n") <= lines:
                step = min(chunk, size)
                size -= step
                f.seek(size)
                data = f.read(step) + data
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]
