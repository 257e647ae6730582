"""`specfleet run`: run the fleet in the foreground."""

from __future__ import annotations

import argparse
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
    import asyncio

    from supervisor.cli.common import load
    from supervisor.daemon import memtrim
    from supervisor.daemon.lifecycle import Daemon
    from supervisor.daemon.logs import configure
    from supervisor.plugin.registry import default_registry

    memtrim.tune_allocator()  # before any thread allocates (memtrim.py)
    configure(json_lines=args.json_logs)
    registry = default_registry()
    loaded = load(args.file, registry)
    # Absolute: the status page and `status` name the file wherever they were run from.
    return asyncio.run(Daemon(Path(args.file).absolute(), loaded, registry).run())
