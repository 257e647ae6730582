"""`specfleet status`: what the running daemon sees, from its API or its status file."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.cli import statusview
from supervisor.config.paths import default_state_dir
from supervisor.daemon import statusfile
from supervisor.errors import SpecfleetError

if TYPE_CHECKING:
    from supervisor.cli.daemonkeys import DaemonKeys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show each target's state, pid, uptime and restarts",
                       description="Read the running daemon's status file. Exit 3 if the "
                       "daemon that wrote it is no longer running.")
    p.add_argument("file", metavar="FILE", nargs="?", help="fleet file (to find its state_dir)")
    p.add_argument("--state-dir", help=f"state directory (default {default_state_dir()})")
    p.add_argument("--target", help="one target in detail, with what actually ran at its last "
                   "launch (argv, runtime version, sha256 of model and draft, GPUs)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=run)


def _daemon_keys(path: str) -> DaemonKeys:
    """state_dir and API token of the fleet file: the light read, else the full load (which
    also reports what is wrong with the file). Imported here: `--state-dir` needs no YAML."""
    from supervisor.cli import daemonkeys

    keys = daemonkeys.read(path)
    if keys is not None:
        return keys
    from supervisor.api.keys import KeyRing
    from supervisor.api.token import read_api_token
    from supervisor.config.loader import load_fleet

    fleet = load_fleet(path).fleet
    # The api_token, else a named key that may read (daemon.keys: the light read leaves
    # those to this load).
    token = read_api_token(fleet) if fleet.daemon.api_token is not None else \
        KeyRing(lambda: fleet).first_reader()
    return daemonkeys.DaemonKeys(Path(fleet.daemon.state_dir).expanduser(), token)


def run(args: argparse.Namespace) -> int:
    keys = _daemon_keys(args.file) if args.file else None
    if args.state_dir:
        state_dir = Path(args.state_dir).expanduser()
    elif keys is not None:
        state_dir = keys.state_dir
    else:
        state_dir = Path(default_state_dir())
    unreadable: list[str] = []
    status = statusfile.read(state_dir, warn=unreadable.append)
    if status is None:
        print(f"specfleet: {unreadable[0]}" if unreadable else
              f"no specfleet daemon has run with state_dir {state_dir} "
              "(give the fleet file or --state-dir)", file=sys.stderr)
        return 1
    status["source"] = f"file {state_dir / statusfile.STATUS_FILE}"
    alive = statusfile.daemon_alive(status.get("daemon", {}))
    if alive:
        status = _status_from_api(status, keys.token if keys else None) or status
    if args.target:
        from supervisor.supervision import runrecord

        target = next((t for t in status.get("targets", []) if t["name"] == args.target), None)
        if target is None:
            names = ", ".join(t["name"] for t in status.get("targets", [])) or "(none)"
            raise SpecfleetError(f"no target {args.target!r} in the status; targets: {names}")
        record = runrecord.read_latest(state_dir, args.target)
        why = _tuning_from_api(status, keys.token if keys else None, args.target) \
            if alive else None
        if args.json:
            print(json.dumps({**target, "run_record": record, "why": why}, indent=1))
        else:
            print(statusview.render_target(target, record, why))
        return 0 if alive else 3
    if args.json:
        print(json.dumps({**status, "daemon_running": alive}, indent=1))
    else:
        print(statusview.render(status, alive, width=terminal_width()))
        for note in _daemon_notes(status, alive):
            print(note)
    return 0 if alive else 3


STALE = 30.0  # seconds; a running daemon rewrites its status file every 5 s


def _daemon_notes(status: dict[str, Any], alive: bool) -> list[str]:
    """What is wrong with the daemon itself: its state dir (status.json and the API)."""
    daemon = status.get("daemon", {})
    notes = []
    if daemon.get("status", "ok") != "ok":
        notes.append(f"daemon: {daemon['status']}")
    updated = daemon.get("updated")
    age = time.time() - updated if isinstance(updated, int | float) else 0.0
    if alive and status.get("source", "").startswith("file") and age > STALE:
        notes.append(f"daemon: the status file was last written {age:.0f} s ago; the daemon "
                     "may not be able to write its state dir (give the fleet file to ask its "
                     "API)")
    return notes


def terminal_width() -> int | None:
    """COLUMNS when set, else the width of the terminal stdout is; None (no limit) when
    stdout is a pipe or a file, so that `specfleet status | grep` sees whole lines."""
    columns = shutil.get_terminal_size(fallback=(0, 0)).columns
    return columns if columns > 0 else None


def _api_get(status: dict[str, Any], token: str | None, path: str) -> tuple[str, Any] | None:
    """(API address, JSON body) of a GET to the running daemon's API; None if it cannot be
    asked (no token, or the API is down: the status file still tells)."""
    import urllib.request

    api = status.get("daemon", {}).get("api")
    if not api:
        return None
    host, _, port = api.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    req = urllib.request.Request(f"http://{host}:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            return f"http://{host}:{port}", json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _status_from_api(status: dict[str, Any], token: str | None) -> dict[str, Any] | None:
    """The live status from the running daemon's API (fresher than the file, which is
    rewritten every few seconds); None if the API cannot be asked."""
    got = _api_get(status, token, "/v1/targets")
    if got is None or not isinstance(got[1], dict) or "targets" not in got[1]:
        return None
    return {**got[1], "source": f"api {got[0]}"}


def _tuning_from_api(status: dict[str, Any], token: str | None,
                     name: str) -> dict[str, Any] | None:
    """Why the target runs its setting (GET /v1/targets/{name}/tuning), if the API answers."""
    from urllib.parse import quote

    got = _api_get(status, token, f"/v1/targets/{quote(name, safe='')}/tuning")
    return got[1] if got is not None and isinstance(got[1], dict) else None
