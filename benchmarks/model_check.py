"""The tuner's model against measurement: predicted and measured speedup of every fixed
setting that benchmarks/class_profile.py measured live.

    .venv/bin/python benchmarks/model_check.py [--profile benchmarks/results/class_profile.json]

For each setup (pair-partial, pair-close: draft models, calibrated; ngram: learnt from
serving), class and load, and each setting:

  measured    tokens per busy second at the setting over the same at off (same class,
              load and run), from the wall time of the cell;
  own         predicted from the calibration's cost and the acceptance the setting itself
              showed (tests the cost model);
  from ref    predicted from the calibration's cost and the acceptance measured at the
              reference length (`--ref`, the longest by default), extrapolated to the
              setting's length by the model (tests the acceptance model too).

Cells that drafted on under 1 % of their tokens did the work off does; how far their
measured ratio is from 1 is printed as the noise of one cell, the floor under the error.

The cost is fitted the way the daemon fits it: the calibration (the setup's off and
synthetic-acceptance cells of class code, per load) as the prior; for n-gram, which has
no synthetic acceptance, every n-gram cell of the load (the cost learnt from serving). Each
class's extra seconds per token (its sampling) is its off cell's over the calibration's
plain step. Prints the table docs/tuning.md shows and the largest error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.tuning.acceptance import ClassAcceptance  # noqa: E402
from supervisor.tuning.cost import Interval, StepCost, fit  # noqa: E402
from supervisor.tuning.prediction import class_speedup  # noqa: E402


def interval(c: dict[str, Any], speculating: bool) -> Interval:
    n = c["counters"]
    return Interval(c["wall_seconds"], n["tokens"], n["drafts"], n["draft_tokens"],
                    n["accepted"], n["prompt_tokens"], speculating=speculating)


def acceptance(c: dict[str, Any], k: int) -> ClassAcceptance:
    n = c["counters"]
    return ClassAcceptance().observe(k, n["drafts"], n["per_position"],
                                     n["tokens"] - n["accepted"], n["draft_tokens"])


def setting_of(name: str) -> int | None:
    return int(name[2:]) if name.startswith("k=") and " " not in name else None


def check(profile: dict[str, Any], setup: str, ref: int | None) -> list[dict[str, Any]]:
    settings = profile["setups"][setup]
    fills = not setup.startswith("ngram")
    cells = {(name, c["class"], c["load"]): c for name, cs in settings.items() for c in cs}
    loads = sorted({load for _, _, load in cells})
    lengths = sorted(k for name in settings if (k := setting_of(name)) is not None)
    ref = ref if ref in lengths else max(lengths)
    rows = []
    for load in loads:
        calibration = [interval(c, name != "off") for (name, cls, ld), c in cells.items()
                       if ld == load and (" synth=" in name or (name == "off" and cls == "code"))]
        if not fills:  # no synthetic acceptance: every cell served at this load
            calibration = [interval(c, name != "off") for (name, _, ld), c in cells.items()
                           if ld == load]
        cost = fit(calibration)
        assert cost is not None
        for cls in sorted({c for _, c, ld in cells if ld == load}):
            off = cells[("off", cls, load)]
            off_rate = off["counters"]["tokens"] / off["wall_seconds"]
            extra = max(0.0, 1 / off_rate - cost.plain)  # the class's sampling, per token
            ref_acc = acceptance(cells[(f"k={ref}", cls, load)], ref)
            for k in lengths:
                c = cells[(f"k={k}", cls, load)]
                measured = c["counters"]["tokens"] / c["wall_seconds"] / off_rate
                drafted = c["counters"]["drafts"] / max(1.0, c["counters"]["tokens"])
                rows.append({"setup": setup, "load": load, "class": cls, "k": k,
                             "measured": round(measured, 3), "drafted": round(drafted, 4),
                             "own": round(speedup(cost, acceptance(c, k), k, fills, extra), 3),
                             "from_ref": round(speedup(cost, ref_acc, k, fills, extra), 3),
                             "ref": ref})
    return rows


def speedup(cost: StepCost, acc: ClassAcceptance, k: int, fills: bool, extra: float) -> float:
    return class_speedup(cost, acc, k, fills_length=fills, overhead=extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=REPO / "benchmarks/results/class_profile.json")
    ap.add_argument("--ref", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    profile = json.loads(args.profile.read_text())
    rows = [r for setup in profile["setups"] for r in check(profile, setup, args.ref)]
    print("| setup | load | class | n | measured | predicted (own acceptance) | "
          "predicted (from n=ref) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setup']} | {r['load']} | {r['class']} | {r['k']} | {r['measured']:.2f}x | "
              f"{r['own']:.2f}x ({r['own'] / r['measured'] - 1:+.0%}) | "
              f"{r['from_ref']:.2f}x ({r['from_ref'] / r['measured'] - 1:+.0%}, n={r['ref']}) |")
    for key in ("own", "from_ref"):
        worst = max(rows, key=lambda r: abs(r[key] / r["measured"] - 1))
        within = sum(abs(r[key] / r["measured"] - 1) <= 0.10 for r in rows)
        print(f"{key}: {within} of {len(rows)} within 10 %; worst {worst['setup']} load "
              f"{worst['load']} {worst['class']} n={worst['k']}: {worst[key]:.2f}x predicted, "
              f"{worst['measured']:.2f}x measured")
    # Cells that (almost) never drafted ran as off did: their measured ratio is the noise
    # of one cell against another with the same work, the floor under any model's error.
    null = [r["measured"] for r in rows if r["drafted"] < 0.01]
    if null:
        spread = max(abs(m - 1) for m in null)
        print(f"noise: {len(null)} cells drafted on under 1 % of tokens (the same work as off); "
              f"their measured ratio spans {min(null):.2f}x..{max(null):.2f}x "
              f"(up to {spread:.0%} from 1.00x)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
