"""The baseline measured again while speculation is off: time off is a baseline for free.

Pure: a memory and a window in, the refreshed memory and the event's data out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.tuning.mix import Summary
from supervisor.tuning.numbers import rounded
from supervisor.tuning.store import TunerMemory
from supervisor.tuning.window import WindowStats


def refreshed(memory: TunerMemory, stats: WindowStats, load: Summary,
              min_tokens: int) -> tuple[TunerMemory, dict[str, Any]]:
    """The memory with the baseline measured again on the tokens served off (a window
    without a draft, of at least `min_tokens`), at the loads they ran at, and the speedups
    measured in this regime rescaled to it; with the old and new baseline for the event.
    Time off measures the baseline for free, and one reading of it, on a shared box, can be
    far off: run 17 of tuner_phases read 38.6 tokens/s once (off served 27.1 in the phase
    that followed), judged 6 at 0.95x and 2 at 0.77x against it, and served code off."""
    if (stats.drafts or stats.tokens < min_tokens or not stats.tokens_per_second
            or not load or not memory.baseline_by_load):
        return memory, {}
    main = max(load, key=lambda b: load[b][0])  # the load most of these tokens ran at
    old, new = memory.baseline_by_load.get(main), load[main][1]
    scale = old / new if old else 1.0  # a speedup judged against `old` is this much higher
    measured = {k: {**m, "speedup": round(float(m["speedup"]) * scale, 4)}
                for k, m in memory.measured.items()}
    before = memory.baseline_by_load
    fresh = {b: t for b, (_, t) in load.items()}
    return replace(memory, baseline_by_load={**before, **fresh}, measured=measured,
                   baseline_tps=(memory.baseline_tps or new) / scale), {
        "baseline_refreshed": {b: [rounded(before.get(b), 2), rounded(t, 2)]
                               for b, t in fresh.items()}}
