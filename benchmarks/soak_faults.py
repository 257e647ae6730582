"""soak.py's faults: each one done to the running fleet, then timed until it is recovered,
against the bound docs/reliability.md promises for it. A fault returns its record:
{fault, target, at, recovered_s (None: not within its bound), bound_s, detail}."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any, Protocol

# Seconds each fault has to be recovered in (docs/reliability.md, "The soak"): a crash is
# backoff (at most 2 s here) plus a start; a hang adds its detection (3 failed probes of
# 1 s, 1 s apart); a daemon restart adds Python's start and adoption; a reload restarts
# the target beside or in place.
BOUNDS = {"kill_runtime": 60.0, "stop_runtime": 60.0, "kill_container": 60.0,
          "kill_daemon": 120.0, "reload_changed": 120.0, "reload_broken": 30.0,
          "api_restart": 60.0, "model_unreadable": 60.0, "state_dir_full": 60.0}
WEIGHTS = {"kill_runtime": 3, "stop_runtime": 2, "kill_container": 2, "kill_daemon": 1,
           "reload_changed": 2, "reload_broken": 1, "api_restart": 2, "model_unreadable": 1,
           "state_dir_full": 1}


class Soaked(Protocol):
    """What a fault needs of soak.py's running daemon."""

    always: list[str]  # targets that always run (process launcher)
    container: str | None  # the container target, if podman runs here
    unreadable: str  # the target whose own model copy may be made unreadable
    full_dir: str | None  # a small tmpfs state dir that can be filled, if mounted

    def target(self, name: str) -> dict[str, Any]: ...
    def kill_daemon(self) -> None: ...
    def start_daemon(self) -> None: ...
    def signal(self, sig: int) -> None: ...
    def edit_fleet(self, change: Callable[[dict[str, Any]], None]) -> None: ...
    def write_raw_fleet(self, text: str | None) -> None: ...
    def api_post(self, path: str) -> int: ...
    def daemon_block(self) -> dict[str, Any]: ...
    def model_of(self, name: str) -> str: ...
    def container_name(self, name: str) -> str: ...
    def podman(self, *args: str) -> list[str]: ...


def until(predicate: Callable[[], Any], bound: float, started: float) -> float | None:
    """Seconds from `started` until predicate() holds; None if not within `bound`."""
    while time.monotonic() - started < bound:
        with contextlib.suppress(Exception):  # the daemon may be down for a moment
            if predicate():
                return round(time.monotonic() - started, 2)
        time.sleep(0.25)
    return None


def ready_again(fleet: Soaked, name: str, old_pid: int | None) -> Callable[[], bool]:
    def check() -> bool:
        t = fleet.target(name)
        return t.get("state") == "ready" and t.get("pid") not in (None, old_pid)
    return check


class Faults:
    def __init__(self, fleet: Soaked, seed: int, each_first: bool = False,
                 without: frozenset[str] = frozenset()) -> None:
        self.fleet = fleet
        self.rand = random.Random(seed)
        # without: kinds left out (e.g. kill_daemon, for one daemon life as long as the run)
        self.available = [f for f in WEIGHTS if self._applies(f) and f not in without]
        # Every kind once, in an order drawn from the seed, before the weighted draws (a
        # short run then still does each of them).
        self.first = self.rand.sample(self.available, len(self.available)) if each_first else []

    def _applies(self, fault: str) -> bool:
        if fault == "kill_container":
            return self.fleet.container is not None
        if fault == "state_dir_full":
            return self.fleet.full_dir is not None
        return True

    def next(self) -> tuple[str, str]:
        """The next fault and its target, drawn from the seed (a run can be replayed)."""
        fault = self.first.pop(0) if self.first else \
            self.rand.choices(self.available, [WEIGHTS[f] for f in self.available])[0]
        runtime_targets = self.fleet.always + ([self.fleet.container]
                                               if self.fleet.container else [])
        if fault == "kill_container":
            return fault, str(self.fleet.container)
        if fault == "model_unreadable":
            return fault, self.fleet.unreadable
        if fault in ("kill_daemon", "reload_broken", "state_dir_full"):
            return fault, "-"
        if fault == "reload_changed":
            return fault, self.rand.choice(self.fleet.always)
        return fault, self.rand.choice(runtime_targets)

    def run(self, fault: str, target: str) -> dict[str, Any]:
        started = time.monotonic()
        record: dict[str, Any] = {"fault": fault, "target": target, "at": time.time(),
                                  "bound_s": BOUNDS[fault]}
        try:
            recovered, detail = getattr(self, fault)(target, started)
        except Exception as exc:  # a fault that could not be done is reported, not fatal
            recovered, detail = None, f"could not do the fault: {exc!r}"
        record.update(recovered_s=recovered, detail=detail)
        return record

    # --- the faults: each returns (recovered_s, detail) ---

    def kill_runtime(self, name: str, started: float) -> tuple[float | None, str]:
        pid = self.fleet.target(name).get("pid")
        if self.fleet.target(name).get("state") != "ready" or not pid:
            return 0.0, "skipped: not ready"
        os.kill(pid, signal.SIGKILL)
        return until(ready_again(self.fleet, name, pid), BOUNDS["kill_runtime"], started), \
            f"kill -9 of pid {pid}"

    def stop_runtime(self, name: str, started: float) -> tuple[float | None, str]:
        pid = self.fleet.target(name).get("pid")
        if self.fleet.target(name).get("state") != "ready" or not pid:
            return 0.0, "skipped: not ready"
        os.kill(pid, signal.SIGSTOP)
        try:
            took = until(ready_again(self.fleet, name, pid), BOUNDS["stop_runtime"], started)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # if the daemon did not end it, let it go on
        return took, f"SIGSTOP of pid {pid}"

    def kill_container(self, name: str, started: float) -> tuple[float | None, str]:
        pid = self.fleet.target(name).get("pid")
        if self.fleet.target(name).get("state") != "ready":
            return 0.0, "skipped: not ready"
        subprocess.run(self.fleet.podman("kill", self.fleet.container_name(name)),
                       capture_output=True, timeout=60, check=False)
        return until(ready_again(self.fleet, name, pid), BOUNDS["kill_container"], started), \
            "podman kill"

    def kill_daemon(self, _: str, started: float) -> tuple[float | None, str]:
        self.fleet.kill_daemon()
        self.fleet.start_daemon()
        took = until(lambda: all(self.fleet.target(n).get("state") == "ready"
                                 for n in self.fleet.always), BOUNDS["kill_daemon"], started)
        return took, "kill -9 of the daemon, then a new one"

    def reload_changed(self, name: str, started: float) -> tuple[float | None, str]:
        pid = self.fleet.target(name).get("pid")

        def toggle(doc: dict[str, Any]) -> None:
            args = doc["targets"][name]["args"]
            i = args.index("--ctx-size") + 1
            args[i] = "1536" if args[i] == "2048" else "2048"
        self.fleet.edit_fleet(toggle)
        self.fleet.signal(signal.SIGHUP)
        return until(ready_again(self.fleet, name, pid), BOUNDS["reload_changed"], started), \
            "its --ctx-size changed, SIGHUP"

    def reload_broken(self, _: str, started: float) -> tuple[float | None, str]:
        self.fleet.write_raw_fleet("version: 1\ntargets: [\n")
        self.fleet.signal(signal.SIGHUP)
        rejected = until(lambda: self.fleet.daemon_block().get("rejected_reload"),
                         BOUNDS["reload_broken"], started)
        self.fleet.write_raw_fleet(None)  # the good file back
        self.fleet.signal(signal.SIGHUP)
        cleared = until(lambda: self.fleet.daemon_block().get("rejected_reload") is None,
                        BOUNDS["reload_broken"], started)
        return (cleared if rejected is not None else None), \
            f"broken YAML, SIGHUP: rejected after {rejected}s; the file restored, SIGHUP"

    def api_restart(self, name: str, started: float) -> tuple[float | None, str]:
        pid = self.fleet.target(name).get("pid")
        status = self.fleet.api_post(f"/v1/targets/{name}/restart")
        return until(ready_again(self.fleet, name, pid), BOUNDS["api_restart"], started), \
            f"POST restart: {status}"

    def model_unreadable(self, name: str, started: float) -> tuple[float | None, str]:
        model = self.fleet.model_of(name)
        pid = self.fleet.target(name).get("pid")
        os.chmod(model, 0)
        try:
            self.fleet.api_post(f"/v1/targets/{name}/restart")
            time.sleep(10)
            seen = self.fleet.target(name).get("state")
        finally:
            os.chmod(model, 0o644)
        self.fleet.api_post(f"/v1/targets/{name}/restart")
        took = until(ready_again(self.fleet, name, pid), BOUNDS["model_unreadable"],
                     time.monotonic())
        return took, f"model unreadable for 10 s (state then {seen}); restored, POST restart"

    def state_dir_full(self, _: str, started: float) -> tuple[float | None, str]:
        assert self.fleet.full_dir is not None
        ballast = os.path.join(self.fleet.full_dir, "ballast")
        subprocess.run(["dd", "if=/dev/zero", f"of={ballast}", "bs=1M", "count=100000"],
                       capture_output=True, check=False, timeout=120)
        time.sleep(20)
        seen = self.fleet.daemon_block().get("status")
        os.unlink(ballast)
        took = until(lambda: self.fleet.daemon_block().get("status") == "ok",
                     BOUNDS["state_dir_full"], time.monotonic())
        return took, f"state dir full for 20 s (status then: {seen})"
