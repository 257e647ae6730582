"""`specfleet export`: print the fleet as a router's configuration."""

from __future__ import annotations

import argparse
import json

from supervisor.cli.common import load
from supervisor.plugin.registry import default_registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="print the fleet as a router's configuration",
                       description="litellm: a LiteLLM proxy config (model_list with one entry "
                       "per target, through specfleet's proxy when it is on, and router "
                       "settings whose health checks do not load models).")
    p.add_argument("router", choices=["litellm"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--format", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from supervisor.api import litellm

    fleet = load(args.file, default_registry()).fleet
    config = litellm.config(fleet)
    if args.format == "json":
        print(json.dumps(config, indent=2))
    else:
        print("# LiteLLM proxy config for the targets of " + args.file + " (specfleet export)")
        print(yaml.safe_dump(config, sort_keys=False), end="")
    return 0
