"""`specfleet bench`: measure one target with speculation off and at a sweep of draft lengths."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="measure speculation off vs a sweep of draft lengths",
                       description="Start one target's runtime (on a free port) without "
                       "speculation and at each draft length of a sweep; send each workload "
                       "class (code that repeats its input, JSON extraction, prose at "
                       "temperature 0.8) RUNS times; print tokens/s, acceptance and speedup, "
                       "write bench.json and bench.png, and recommend a setting.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--target", required=True, help="the target to benchmark")
    p.add_argument("--runs", type=int, default=3, help="runs per setting and workload (3)")
    p.add_argument("--lengths", help="comma list of draft lengths (default: powers of two "
                   "within the target's length bounds)")
    p.add_argument("--classes", help="comma list of built-in workloads: code,json,prose")
    p.add_argument("--prompts", help="your own prompts: JSON lines {class, prompt, sampling "
                   "keys} or plain text, prompts separated by blank lines")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per completion (128)")
    p.add_argument("--out", help="output directory (default specfleet-bench-TARGET-TIME)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from supervisor.bench import runner as bench_runner
    from supervisor.bench import workloads
    from supervisor.cli.common import speculating_target
    from supervisor.plugin.registry import default_registry

    registry = default_registry()
    _, target = speculating_target(args.file, args.target, registry, "to benchmark")
    backend_cls = registry.get(target.backend)
    assert backend_cls is not None
    probe = backend_cls(target)
    if args.lengths:
        lengths = sorted({int(x) for x in args.lengths.split(",")})
    elif probe.tunable_length() is None:
        lengths = [probe.default_length() or 1]
    else:
        length = target.speculation.length
        lengths = bench_runner.sweep_lengths(length.min, length.max or probe.length_ceiling(),
                                             length.start)
    chosen = [workloads.BUILT_IN[c] for c in args.classes.split(",")] if args.classes else []
    if args.prompts:
        chosen += workloads.load_user_prompts(Path(args.prompts))
    if not chosen:
        chosen = list(workloads.BUILT_IN.values())
    out_dir = Path(args.out or f"specfleet-bench-{target.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"benchmarking {target.name}: speculation off and draft lengths "
          f"{', '.join(map(str, lengths))}; workloads {', '.join(w.name for w in chosen)}; "
          f"{args.runs} runs each", file=sys.stderr)
    runner = bench_runner.BenchRunner(target, backend_cls, chosen, args.runs, args.max_tokens,
                                      out_dir, lambda msg: print(msg, file=sys.stderr, flush=True))
    results = asyncio.run(runner.run(lengths))
    table, json_path, png_path = bench_runner.write_report(out_dir, target, results,
                                                           runner.commands)
    print(table)
    print(f"\nwritten: {json_path}, {png_path}")
    return 0
