"""soak.py's invariants, checked all along and at the end (docs/reliability.md, "The
soak"): nothing left over, the daemon's resources flat, status and events agreeing, the
state files readable. Each check returns the violations it found (empty: it held)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psutil


def runtimes_of(marker: str) -> dict[int, str]:
    """llama-server processes whose command line names `marker` (the soak's directory)."""
    out = {}
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if marker in cmd and "llama-server" in cmd and proc.info["status"] != "zombie":
            out[proc.info["pid"]] = cmd
    return out


def containers_of(state_dir: str, podman: list[str] | None = None) -> list[str]:
    """Containers labelled with the soak daemon's state dir (running or not); `podman`: its
    argv where the daemon runs."""
    try:
        out = subprocess.run([*(podman or ["podman"]), "ps", "-a", "--filter",
                              f"label=io.specfleet.daemon={state_dir}", "--format",
                              "{{.Names}} {{.State}}"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.splitlines() if line.strip()]


def orphans(marker: str, status: dict[str, Any] | None) -> list[str]:
    """Runtimes that no target of the running daemon owns (`status` None: no daemon runs,
    so every runtime but an adoptable container's is one). A container's server is owned
    by its container, checked apart."""
    owned = {t.get("pid") for t in (status or {}).get("targets", [])
             if t.get("state") not in ("stopped", "unloaded", "failed")}
    found = []
    for pid, cmd in runtimes_of(marker).items():
        try:
            parent = psutil.Process(pid).parent()
        except psutil.Error:
            continue
        if parent is not None and parent.name() == "conmon":
            continue  # a container's: adopted or removed by the next daemon
        if status is not None and parent is not None and _is_daemon(parent):
            # A child of the running daemon is not an orphan even where no target lists
            # it: the tuner's calibration beside a server, an old server draining.
            continue
        if pid not in owned:
            found.append(f"pid {pid}: {cmd[:160]}")
    return found


def _is_daemon(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return "supervisor" in " ".join(cmd) and "run" in cmd


def status_matches_events(state_dir: Path) -> list[str]:
    """Every target's state in status.json is the `new` state of its last state event in
    events.jsonl (a state change the log does not have is a violation)."""
    try:
        status = json.loads((state_dir / "status.json").read_text())
        lines = (state_dir / "events.jsonl").read_text().splitlines()
    except (OSError, ValueError) as exc:
        return [f"cannot read the state files: {exc!r}"]
    last: dict[str, str] = {}
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill -9: counted by state_files_readable
        if e.get("kind") == "state":
            last[e["target"]] = e.get("new")
    wrong = []
    for t in status.get("targets", []):
        if t["name"] in last and last[t["name"]] != t["state"]:
            wrong.append(f"{t['name']}: status says {t['state']}, its last event {last[t['name']]}")
    return wrong


def state_files_readable(state_dir: Path) -> list[str]:
    """tuning.json parses; every run record line parses (the last line of a file may be cut
    by a kill -9 mid-write: the daemon must then keep reading the rest)."""
    bad = []
    tuning = state_dir / "tuning.json"
    if tuning.exists():
        try:
            json.loads(tuning.read_text())
        except ValueError as exc:
            bad.append(f"tuning.json: {exc}")
    for path in sorted((state_dir / "runs").glob("*.jsonl")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                json.loads(line)
            except ValueError:
                if i != len(lines) - 1:
                    bad.append(f"{path.name} line {i + 1} does not parse")
    return bad


def slope_per_hour(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (time s, value) per hour; None under 3 samples or 10 min."""
    if len(samples) < 3 or samples[-1][0] - samples[0][0] < 600:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    cov = sum((t - mt) * (v - mv) for t, v in samples)
    return cov / var * 3600 if var else None


class DaemonResources:
    """RSS, open files and threads of each daemon incarnation, sampled; slopes per hour."""

    def __init__(self) -> None:
        self.samples: dict[int, list[tuple[float, dict[str, float]]]] = {}

    def sample(self, pid: int, now: float) -> None:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                values = {"rss_mb": proc.memory_info().rss / 2 ** 20,
                          "open_files": float(proc.num_fds()), "threads": float(proc.num_threads())}
        except psutil.Error:
            return
        self.samples.setdefault(pid, []).append((now, values))

    def slopes(self) -> dict[str, Any]:
        """The longest-lived incarnation's slopes (the first minutes, imports and the first
        loads, left out: growth that stops is not a leak)."""
        if not self.samples:
            return {}
        pid, rows = max(self.samples.items(), key=lambda kv: kv[1][-1][0] - kv[1][0][0])
        rows = [r for r in rows if r[0] - rows[0][0] >= 120]
        out: dict[str, Any] = {"pid": pid, "minutes": round((rows[-1][0] - rows[0][0]) / 60, 1)
                               if rows else 0}
        for key in ("rss_mb", "open_files", "threads"):
            s = slope_per_hour([(t, v[key]) for t, v in rows])
            out[f"{key}_per_hour"] = None if s is None else round(s, 2)
        out["rss_mb_last"] = round(rows[-1][1]["rss_mb"], 1) if rows else None
        # Halves apart: bounded stores filling (growth that stops) from growth that goes on.
        if rows:
            mid = (rows[0][0] + rows[-1][0]) / 2
            halves = ([r for r in rows if r[0] <= mid], [r for r in rows if r[0] >= mid])
            out["rss_mb_per_hour_halves"] = [
                None if (s := slope_per_hour([(t, v["rss_mb"]) for t, v in half])) is None
                else round(s, 2) for half in halves]
        return out

    def series(self, every: float = 60.0) -> dict[str, list[list[float]]]:
        """Each incarnation's RSS, a reading a minute ([seconds since its first, MB]): what a
        slope came from, kept in the result so that growth can be told from a step."""
        out = {}
        for pid, rows in self.samples.items():
            kept, last = [], None
            for t, v in rows:
                if last is None or t - last >= every:
                    kept.append([round(t - rows[0][0], 1), round(v["rss_mb"], 2)])
                    last = t
            out[str(pid)] = kept
        return out
