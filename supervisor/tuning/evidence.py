"""Why the tuner runs what it runs: its decision log and the evidence behind the setting.

The tuner memory (store.py) already keeps what was measured: the speedup over speculation
off at each draft length tried in the current workload, what each n-gram variant reached,
the baseline. What it did not keep is the decisions themselves with what each restart
cost; `logged` adds a decision as it is applied and `booked` the restart's measured time
once the new server is ready. `why` puts both into one plain view, the one that
`GET /v1/targets/{name}/tuning`, `specfleet status --target` and the status page's "Why
this setting" chart show. Pure: memory in, memory or dict out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.tuning.store import SPECULATING, TunerMemory

KEPT = 20  # decisions kept per target (tuning.json stays small)
# Numbers of a decision's data worth showing beside its reason (the rest is in the event).
SHOWN = ("speedup", "measured_speedup", "predicted_speedup", "predicted_gain",
         "acceptance_rate", "baseline_tps", "switch_cost_s", "pays_back_after_s", "waited_s")


def logged(memory: TunerMemory, reason: str, data: dict[str, Any], now: float) -> TunerMemory:
    """The memory with a decision just applied at the end of its log."""
    entry = {"time": round(now, 3), "action": str(data.get("action", "")), "reason": reason,
             "old_length": data.get("old_length"), "new_length": data.get("new_length"),
             "speculation": bool(data.get("speculation", True)), "variant": data.get("variant"),
             "numbers": {k: data[k] for k in SHOWN if isinstance(data.get(k), int | float)},
             "restart": None}
    return replace(memory, decisions=[*memory.decisions, entry][-KEPT:])


def booked(memory: TunerMemory, seconds: float, beside: bool) -> TunerMemory:
    """The memory with the restart of its latest decision timed: `seconds` until the new
    server was ready; `beside`: the old one served meanwhile (no service lost)."""
    if not memory.decisions or memory.decisions[-1].get("restart") is not None:
        return memory
    last = {**memory.decisions[-1],
            "restart": {"ready_after_s": round(seconds, 2), "beside": beside,
                        "unserved_s": 0.0 if beside else round(seconds, 2)}}
    return replace(memory, decisions=[*memory.decisions[:-1], last])


def cost(restart: dict[str, Any] | None) -> str:
    """What a decision's restart cost, in words (the CLI and the page show this)."""
    if not restart:
        return "restart not timed (the daemon restarted meanwhile, or it is under way)"
    if restart.get("beside"):
        return (f"new server ready after {restart['ready_after_s']:.1f} s beside the old one: "
                "0 s unserved")
    return f"restart in place: {restart['unserved_s']:.1f} s unserved"


def _running(memory: TunerMemory, length: int | None, variant: str | None) -> dict[str, Any]:
    if memory.phase != SPECULATING:
        return {"speculation": False, "phase": memory.phase, "length": None,
                "variant": variant}
    return {"speculation": True, "phase": memory.phase, "length": length, "variant": variant,
            "lengths_by_load": dict(memory.lengths_by_load)}


def _points(memory: TunerMemory, variant: str | None) -> list[dict[str, Any]]:
    """Every measured speedup over speculation off: by length in the current workload (the
    running variant's), and each other variant at its best length."""
    points = [{"length": int(k), "variant": variant, "speedup": round(m["speedup"], 3),
               "by_load": {b: round(x, 3) for b, x in (m.get("by_load") or {}).items()},
               "accepted_per_draft": round(m.get("accepted_per_draft", 0.0), 3)}
              for k, m in sorted(memory.measured.items(), key=lambda kv: int(kv[0]))]
    points += [{"length": r.get("length"), "variant": v, "speedup": round(r["speedup"], 3),
                "by_load": {}, "accepted_per_draft": None}
               for v, r in sorted(memory.variants.items())
               if v != variant and isinstance(r.get("speedup"), int | float)]
    return points


def why(memory: TunerMemory, *, length: int | None, variant: str | None,
        start: int | None) -> dict[str, Any]:
    """The evidence behind the running setting (`length`, `variant`: what the tuner passes
    to the runtime; `start`: the fleet file's `length.start`)."""
    return {"running": _running(memory, length, variant), "start": start,
            "baseline": {"tokens_per_second": memory.baseline_tps,
                         "by_load": dict(memory.baseline_by_load)},
            "measured": _points(memory, variant),
            "decisions": [{**d, "cost": cost(d.get("restart"))} for d in memory.decisions],
            "summary": summary(memory, length, variant)}


def summary(memory: TunerMemory, length: int | None, variant: str | None) -> str:
    """One sentence: the setting and the measurement it rests on."""
    last = memory.decisions[-1]["reason"] if memory.decisions else None
    if memory.phase != SPECULATING:
        what = "speculation is off" if memory.phase == "off" else \
            "speculation is off while the baseline is measured"
        return f"{what}" + (f": {last}" if last else "")
    if memory.baseline_tps is None:
        return "no baseline measured yet: nothing to compare the setting with"
    here = memory.measured.get(str(length)) if length is not None else None
    name = f"{variant} " if variant else ""
    if here is None:
        return f"{name}n={length}: not measured yet in this workload" + (
            f" ({last})" if last else "")
    return (f"{name}n={length} measured {here['speedup']:.2f}x speculation off "
            f"({len(memory.measured)} length(s) measured in this workload)")
