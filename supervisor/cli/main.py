"""The `specfleet` command line: the top-level parser and error handling; each command lives in
its own module with its sub-parser and handler.

Building the parser imports every command's module, so those modules import at their top
only what their sub-parser needs; the rest (the fleet file's schema, the backends and their
plugins, the daemon) is imported by the handler: `specfleet status` loads neither the daemon
nor aiohttp nor the backends (benchmarks/daemon_overhead.py times it against the code that
imported everything).
"""

from __future__ import annotations

import argparse
import os
import sys

from supervisor import __version__
from supervisor.cli import (
    bench,
    calibrate,
    check,
    examples,
    export,
    pull,
    run,
    setup,
    status,
    units,
)
from supervisor.errors import FleetFileError, SpecfleetError

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
  specfleet examples             the example fleets shipped with specfleet (--copy DIR)

where things are (daemon.state_dir, default /var/lib/specfleet as root, else
~/.local/state/specfleet):
  <state_dir>/status.json        what `specfleet status` reads
  <state_dir>/events.jsonl       every state change and decision, with its reason
  <state_dir>/logs/<target>.log  each runtime's own stdout and stderr (rotated)

exit status: 0 ok, 1 runtime error, 2 bad fleet file or bad usage,
             3 (status) the daemon that wrote the status is not running,
             141 the reader of the output went away (`specfleet status | head`).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfleet", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"specfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # The order here is the order `specfleet --help` lists the commands in.
    for command in (check, run, status, pull, bench, calibrate, export, units, setup,
                    examples):
        command.register(sub)
    return parser


# What a shell reports for a program that SIGPIPE ended (128 + 13), as for `cat` or `git log`
# piped into `head`: quiet, but not a claim that all the output was written (`set -o pipefail`).
EXIT_BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            code = _dispatch(build_parser().parse_args(argv))  # --help exits in parse_args
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except BrokenPipeError:
        # The reader closed the pipe (`| head`). Python ignores SIGPIPE, so the write failed
        # instead; point stdout at /dev/null so that the exit flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace) -> int:
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
