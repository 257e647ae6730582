"""`specfleet calibrate`: measure what a step of one target costs on this machine."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure what a drafted step costs (the tuner's model)",
                       description="Start one target's runtime on a free port without "
                       "speculation, then at two draft lengths with a synthetic acceptance "
                       "(llama.cpp's --spec-synth-rates), time its steps, print what a plain "
                       "step, a drafted step, each drafted token and each accepted token cost, "
                       "and keep it in the state directory's tuning.json, where the tuner "
                       "starts from it. The daemon does this by itself beside the serving "
                       "server where memory allows (docs/tuning.md).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--target", required=True, help="the target to calibrate")
    p.add_argument("--completions", type=int, default=6,
                   help="completions per setting (6); each is one interval of the fit")
    p.add_argument("--tokens", type=int, default=64, help="tokens per completion (64)")
    p.add_argument("--dry-run", action="store_true", help="print, keep nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import tempfile
    import time
    from dataclasses import replace
    from pathlib import Path

    from supervisor.cli.common import speculating_target
    from supervisor.plugin.registry import default_registry
    from supervisor.supervision.calibration import Calibrator, lengths_for
    from supervisor.tuning.store import TuningStore, fingerprint, runtime_key

    registry = default_registry()
    loaded, target = speculating_target(args.file, args.target, registry,
                                        "to calibrate: a step has one cost")
    fleet = loaded.fleet
    backend_cls = registry.get(target.backend)
    assert backend_cls is not None
    length = target.speculation.length
    lengths = lengths_for(length.min, length.max or backend_cls(target).length_ceiling())
    with tempfile.TemporaryDirectory(prefix="specfleet-calibrate-") as work:
        calibrator = Calibrator(target, backend_cls, Path(work),
                                lambda msg: print(msg, file=sys.stderr, flush=True),
                                args.completions, args.tokens)
        info = asyncio.run(calibrator.backend.preflight())
        result = asyncio.run(calibrator.run(lengths))
    print(f"{target.name}: {result.intervals} intervals; lengths {lengths[0]} and "
          f"{lengths[1]} at a synthetic acceptance")
    for bucket, c in result.costs.items():
        print(f"  {bucket} running: a plain step {c.plain * 1e3:.2f} ms; a drafted step "
              f"{c.step * 1e3:.2f} ms + {c.per_draft * 1e3:.2f} ms per drafted token + "
              f"{c.per_accepted * 1e3:.2f} ms per accepted token; in plain steps, all / none "
              "accepted: " + ", ".join(f"n={k} {c.drafted(k, k) / c.plain:.1f} / "
                                       f"{c.drafted(k, 0) / c.plain:.1f}" for k in (2, 4, 8, 16)))
    if args.dry_run:
        return 0
    state_dir = Path(fleet.daemon.state_dir).expanduser()
    store = TuningStore(state_dir / "tuning.json")
    memory = store.load(target.name, fingerprint(target))
    key = runtime_key(target, info)
    learnt = memory.learnt if memory.runtime_key == key else {}
    store.save(target.name, replace(memory, runtime_key=key, learnt=learnt,
                                    calibration={**result.to_dict(), "time": round(time.time())}))
    print(f"kept in {state_dir / 'tuning.json'}: the daemon's tuner starts from it (a daemon "
          "running now keeps its own memory of this target: run this while it is stopped)")
    return 0
