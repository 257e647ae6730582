"""What a day of status-page history costs the daemon in memory (issue 30: RSS growth).

    .venv/bin/python benchmarks/history_memory.py [--samples 17280] [--targets 6]

A day of samples at the daemon's most frequent (one every 5 s: 17,280 per target) for
`--targets` targets, through daemon/history.py as the daemon records them, measured with
tracemalloc. The baseline, in the same run: the same samples kept the way history.py kept
them before (a deque of one dict per sample, as read from its JSON line). Printed: bytes per
sample of each and the ratio. Pure Python, no server: nothing else need be idle.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import tempfile
import tracemalloc
from pathlib import Path

from supervisor.daemon.history import SAMPLED, History


def shown(rng: random.Random) -> dict[str, float | int | None]:
    return {"tokens_per_second": round(rng.uniform(20, 90), 2),
            "acceptance_rate": round(rng.random(), 4),
            "mean_accepted_length": round(rng.uniform(1, 6), 4),
            "draft_length": rng.choice((4, 8, 16, None))}


def as_dicts(samples: int, targets: int, rng: random.Random) -> object:
    """The earlier in-memory form: a deque per target of {"t", "s": {...}} dicts."""
    kept = {}
    for n in range(targets):
        points: collections.deque[dict] = collections.deque(maxlen=samples)
        for i in range(samples):
            points.append(json.loads(json.dumps({"t": round(1e9 + 5 * i, 3),
                                                 "s": {k: shown(rng)[k] for k in SAMPLED}})))
        kept[f"t{n}"] = points
    return kept


def as_history(samples: int, targets: int, rng: random.Random, directory: Path) -> object:
    clock = [1e9]
    history = History(directory, keep=24 * 3600 + 60, max_points=samples,
                      clock=lambda: clock[0])
    for i in range(samples):
        clock[0] = 1e9 + 5 * i
        for n in range(targets):
            history.sample(f"t{n}", shown(rng), when=clock[0])
    return history


def measure(build) -> int:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=17_280)
    parser.add_argument("--targets", type=int, default=6)
    args = parser.parse_args()
    n = args.samples * args.targets
    dicts = measure(lambda: as_dicts(args.samples, args.targets, random.Random(1)))
    with tempfile.TemporaryDirectory() as tmp:
        compact = measure(lambda: as_history(args.samples, args.targets, random.Random(1),
                                             Path(tmp)))
    result = {"samples": n, "dict_bytes_per_sample": round(dicts / n, 1),
              "history_bytes_per_sample": round(compact / n, 1),
              "ratio": round(compact / dicts, 3),
              "history_mb_per_day": round(compact / 2**20, 2),
              "dict_mb_per_day": round(dicts / 2**20, 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
