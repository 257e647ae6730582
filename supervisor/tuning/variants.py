"""Searching beyond length: which n-gram variant (llama.cpp's mod, simple, map-k, map-k4v).

The best variant depends on the text (measured here on gemma-3-270m: ngram-simple 1.90x
against ngram-mod 1.68x on looping prose; ngram-mod ahead on code rewrites), so where the
fleet file allows several (`speculation.variants`), the length search runs for one variant
at a time and this layer sits on top of it. When the length search settles on the current
variant ("keep"), or finds that it does not pay ("disable"), the variant's measured speedup
at its tuned length is recorded and the next untried variant is started; once all are
tried, the best one is run at its best length (the running one is left only for one
ahead of it by `min_gain`), or speculation goes off if none pays. A
drift of acceptance forgets the results (the workload they describe is gone) and the search
starts again. Every switch is a `tuning` event with action `variant` and the numbers.
`search` is a pure function of the length layer's decision, like `decisions.plan`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.config.schema import Tuning
from supervisor.tuning.decisions import Action, Decision
from supervisor.tuning.store import SPECULATING


def allowed_variants(configured: tuple[str, ...] | str | None, start: str | None,
                     runtime: tuple[str, ...]) -> tuple[str, ...]:
    """The variants to search, the starting one first (unset: the runtime's first, its
    default); () when there is nothing to search."""
    if configured is None or not runtime:
        return ()
    pool = runtime if configured == "auto" else tuple(configured)
    first = start or runtime[0]
    ordered = ((first,) if first in pool else ()) + tuple(v for v in pool if v != first)
    return ordered if len(ordered) > 1 else ()


def search(decision: Decision | None, variant: str, allowed: tuple[str, ...],
           settings: Tuning, now: float) -> Decision | None:
    """The length layer's decision, or a switch of variant in its place."""
    if decision is None or decision.action not in ("keep", "disable") or not allowed:
        return decision
    data = decision.data
    if data.get("measured_speedup") is None:
        return decision
    # Only allowed variants count: the fleet file may have narrowed the list since.
    results = {v: r for v, r in decision.memory.variants.items() if v in allowed}
    results[variant] = {"length": data.get("old_length"), "speedup": data["measured_speedup"]}
    verdict = "does not pay" if decision.action == Action.DISABLE else "settled"
    said = (f"n-gram variant {variant} {verdict} at length {data.get('old_length')} "
            f"({data['measured_speedup']:.2f}x)")
    untried = [v for v in allowed if v not in results]
    if untried:
        return _switch(decision, variant, untried[0], None, results, now,
                       f"{said}; trying variant {untried[0]}")
    best = max(results, key=lambda v: results[v]["speedup"])
    pays = results[best]["speedup"] >= 1.0 + settings.off_margin
    # A switch is a restart: the running variant, measured again just now, is left only
    # for one ahead by min_gain (or when it does not pay). Without the margin, two variants
    # within noise of each other took turns (tuner_phases run 9: mod 2.32x / simple 2.24x,
    # then mod 2.14x: a switch at each measurement).
    ahead = (decision.action == Action.DISABLE or results[best]["speedup"]
             >= results[variant]["speedup"] * (1.0 + settings.min_gain))
    if best != variant and pays and ahead:
        return _switch(decision, variant, best, results[best]["length"], results, now,
                       f"{said}; every allowed variant measured "
                       f"({_measured(results)}): running the best, {best}")
    memory = replace(decision.memory, variants=results)
    return replace(decision, memory=memory, data={**data, "variants": results})


def _switch(decision: Decision, old: str, new: str, length: int | None,
            results: dict[str, dict[str, Any]], now: float, reason: str) -> Decision:
    memory = replace(decision.memory, phase=SPECULATING, variant=new, length=length,
                     measured={}, variants=results, last_change=now)
    data = {**decision.data, "old_variant": old, "new_variant": new, "variants": results}
    memory = replace(memory, last_decision=data)
    return Decision(Action.VARIANT, memory, reason, data)


def _measured(results: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{v} {r['speedup']:.2f}x at {r['length']}" for v, r in results.items())

