"""`specfleet run`: run the fleet in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the fleet in the foreground",
                       description="Start every target of FILE and keep it healthy until "
                       "SIGTERM or SIGINT; SIGHUP reloads FILE (only changed targets restart; "
                       "a bad file changes nothing).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json-logs", action="store_true", default=None,
                   help="log JSON lines even on a terminal (default: JSON when not a terminal)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Every exit is a clean exit (docs/systemd.md): a SIGTERM while the fleet file is read,
    # before anything started, ends `run` with 0; from the daemon's first step on its loop
    # takes SIGTERM (lifecycle.py); once it returned, the exit is decided and a second
    # SIGTERM (systemd's, a user's) must not turn it into death by signal.
    signal.signal(signal.SIGTERM, _stopped_before_start)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stopped_before_start(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from supervisor.cli.common import load
    from supervisor.daemon import memtrim
    from supervisor.daemon.lifecycle import Daemon
    from supervisor.daemon.logs import configure
    from supervisor.plugin.registry import default_registry

    memtrim.tune_allocator()  # before any thread allocates (memtrim.py)
    configure(json_lines=args.json_logs)
    registry = default_registry()
    loaded = load(args.file, registry, waiting=True)
    if loaded.waiting:
        print(degraded_notice(loaded.waiting), file=sys.stderr)
    # Absolute: the status page and `status` name the file wherever they were run from.
    return asyncio.run(Daemon(Path(args.file).absolute(), loaded, registry).run())


def degraded_notice(waiting: dict[str, tuple[str, ...]]) -> str:
    """What `run` says when it starts the fleet without some targets: each, and why."""
    names = ", ".join(waiting)
    lines = [f"specfleet: starting the fleet degraded: {len(waiting)} target(s) wait for what "
             f"this host lacks ({names}); the others start now, and each waiting target starts "
             "by itself once what it lacks is there (`specfleet check` reports these as "
             "errors):"]
    lines += [f"  {line}" for found in waiting.values() for line in found]
    return "\n".join(lines)
