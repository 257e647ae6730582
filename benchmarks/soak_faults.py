"""soak.py's faults: each one done to the running fleet, then timed until it is recovered,
against the bound docs/reliability.md promises for it. A fault returns its record:
{fault, target, at, recovered_s (None: not within its bound), bound_s, detail}."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

# Seconds each fault has to be recovered in (docs/reliability.md, "The soak"): a crash is
# backoff (at most 2 s here) plus a start; a hang adds its detection (3 failed probes of
# 1 s, 1 s apart); a daemon restart adds Python's start and adoption; a reload restarts
# the target beside or in place. A target that waited for its file: from the file's return,
# a look (at most every 10 s, supervision/waiting.py) and a start. A rotated key: at once.
BOUNDS = {"kill_runtime": 60.0, "stop_runtime": 60.0, "kill_container": 60.0,
          "kill_daemon": 120.0, "reload_changed": 120.0, "reload_broken": 30.0,
          "api_restart": 60.0, "model_gone": 60.0, "truncated_then_whole": 60.0,
          "key_rotated": 10.0, "state_dir_full": 60.0}
WEIGHTS = {"kill_runtime": 3, "stop_runtime": 2, "kill_container": 2, "kill_daemon": 1,
           "reload_changed": 2, "reload_broken": 1, "api_restart": 2, "model_gone": 1,
           "truncated_then_whole": 1, "key_rotated": 1, "state_dir_full": 1}
# A target whose file went: its API restart refused, its crash then seen as waiting.
WAIT_BOUND = 30.0


class Soaked(Protocol):
    """What a fault needs of soak.py's running daemon."""

    always: list[str]  # targets that always run (process launcher)
    container: str | None  # the container target, if podman runs here
    mounted: str  # the target whose own model copy lies on the "NAS" (a folder)
    nas: Path  # that folder, which a fault moves away and back
    state_dir: str
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
    def rotate_key(self, scope: str) -> tuple[str | None, str]: ...
    def proxy_status(self, path: str, key: str | None) -> int: ...
    def complete(self, name: str) -> tuple[int, str]: ...
    def status(self) -> dict[str, Any]: ...
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
        if fault in ("model_gone", "truncated_then_whole"):
            return fault, self.fleet.mounted
        if fault in ("kill_daemon", "reload_broken", "state_dir_full", "key_rotated"):
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

    def model_gone(self, name: str, started: float) -> tuple[float | None, str]:
        """The target's "NAS" goes away (its folder moved, as a share unmounted): a restart
        asked through the API is not done (the server keeps serving); the server then crashes
        and the target waits, its requests answered 503 with the reason; the folder comes back
        and the target serves again without a reload, no other target restarted."""
        nas = self.fleet.nas
        away = nas.with_name(nas.name + ".away")

        def gone() -> None:
            os.rename(nas, away)

        def back() -> None:
            os.rename(away, nas)
        return self._waits_for_its_file(name, gone, back, "model_gone", "its NAS folder moved away")

    def truncated_then_whole(self, name: str, started: float) -> tuple[float | None, str]:
        """The model file replaced by a truncated copy (a download that did not finish), the
        server crashes, the target waits; the whole file is put back (a rename, as a
        downloader finishes) and the target serves again."""
        model = Path(self.fleet.model_of(name))
        whole = model.with_name(model.name + ".whole")

        def truncate() -> None:
            os.rename(model, whole)  # the running server keeps the whole file it mapped
            part = model.with_name(model.name + ".part")
            with open(whole, "rb") as src, open(part, "wb") as dst:
                dst.write(src.read(os.path.getsize(whole) // 2))
            os.replace(part, model)

        def whole_again() -> None:
            os.replace(whole, model)
        return self._waits_for_its_file(name, truncate, whole_again, "truncated_then_whole",
                                        "truncated to half")

    def _waits_for_its_file(self, name: str, spoil: Callable[[], None],
                            mend: Callable[[], None], fault: str,
                            how: str) -> tuple[float | None, str]:
        """What model_gone and truncated_then_whole check (docs/reliability.md, "The soak"):
        (seconds from the file's return to serving again, or None when any step failed)."""
        pid = self.fleet.target(name).get("pid")
        if self.fleet.target(name).get("state") != "ready" or not pid:
            return 0.0, "skipped: not ready"
        others = self._restarts_of_others(name)
        problems: list[str] = []
        spoil()
        try:
            asked = time.time()
            self.fleet.api_post(f"/v1/targets/{name}/restart")
            refused = until(lambda: self._restart_refused(name, asked), WAIT_BOUND,
                            time.monotonic())
            if refused is None or self.fleet.target(name).get("pid") != pid:
                problems.append("the API restart was not refused with the server kept")
            os.kill(pid, signal.SIGKILL)
            waited = until(lambda: self.fleet.target(name).get("state") == "waiting",
                           WAIT_BOUND, time.monotonic())
            if waited is None:
                problems.append(f"not waiting within {WAIT_BOUND:g} s of its crash")
                answer = ""
            else:
                code, answer = self.fleet.complete(name)
                if code != 503 or "plain-model.gguf" not in answer:
                    problems.append(f"its request got {code} {answer[:200]}, not a 503 "
                                    "naming the file")
        finally:
            mend()
        took = until(ready_again(self.fleet, name, pid), BOUNDS[fault], time.monotonic())
        moved = {n: (was, now) for n, was in others.items()
                 if (now := self._restarts_of_others(name).get(n)) != was}
        if moved:
            problems.append(f"other targets restarted (restarts before, after): {moved}")
        detail = (f"{how}; API restart refused after {refused} s, waiting {waited} s after "
                  f"kill -9 of pid {pid}; the file back: serving after {took} s")
        if problems:
            return None, detail + "; FAILED: " + "; ".join(problems)
        return took, detail

    def _restarts_of_others(self, name: str) -> dict[str, int]:
        """The always-running targets' restarts after failures, but `name`'s."""
        return {t["name"]: t.get("restarts", 0) for t in self.fleet.status().get("targets", [])
                if t["name"] != name and t["name"] in [*self.fleet.always, self.fleet.container]}

    def _restart_refused(self, name: str, since: float) -> bool:
        """events.jsonl has `name`'s restart, asked after `since`, refused (the server kept)."""
        for line in (Path(self.fleet.state_dir) / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                e = json.loads(line)
                if e.get("target") == name and e.get("kind") == "restart" and \
                        e.get("time", 0) >= since and e.get("data", {}).get("refused"):
                    return True
        return False

    def key_rotated(self, _: str, started: float) -> tuple[float | None, str]:
        """The inference key's file rewritten while the clients use it: the old key is refused
        (401) at once, the new one serves; each client reads the file for each request and
        sends a request that met a rotation once more (Traffic.rekeyed)."""
        old, new = self.fleet.rotate_key("inference")
        took = until(lambda: self.fleet.proxy_status("/v1/models", new) == 200
                     and self.fleet.proxy_status("/v1/models", old) == 401,
                     BOUNDS["key_rotated"], started)
        return took, "the router's key file rewritten: the old key 401, the new one 200"

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
