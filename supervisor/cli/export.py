"""`specfleet export`: print the fleet as a router's configuration."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="print the fleet as a router's configuration",
                       description="litellm: a LiteLLM proxy config (model_list with one entry "
                       "per target, through specfleet's proxy when it is on, and router "
                       "settings whose health checks do not load models). Needs only the "
                       "fleet file: missing model files or runtimes are warnings here, so a "
                       "router host can run it. A key read from a file becomes an "
                       "os.environ/VAR reference; what VAR must hold is a comment in the YAML "
                       "(on stderr with --format json).")
    p.add_argument("router", choices=["litellm"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--format", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from supervisor.api import litellm
    from supervisor.cli.common import load
    from supervisor.plugin.registry import default_registry

    registry = default_registry()
    fleet = load(args.file, registry, runtime_files=False).fleet
    config = litellm.config(fleet, lambda t: registry.launcher_class(t).export_info(t))
    notes = litellm.notes(fleet)
    if args.format == "json":
        for note in notes:  # JSON has no comments; stdout stays the config alone
            print(f"specfleet: note: {note}", file=sys.stderr)
        print(json.dumps(config, indent=2))
    else:
        # One comment line each: a newline in a path must not end the comment.
        for line in (f"LiteLLM proxy config for the targets of {args.file} (specfleet export)",
                     *notes):
            print("# " + " ".join(line.splitlines()))
        print(yaml.safe_dump(config, sort_keys=False), end="")
    return 0
