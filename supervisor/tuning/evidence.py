"""Why the tuner runs what it runs, in words and labelled numbers.

`logged` adds a decision to the memory as it is applied (with the prediction it was made
on), `booked` the restart's measured time once the new server is ready. `why` puts the
model into one view: the cost of a step (calibrated, refined), each class's acceptance,
the predicted speedup of every setting for the current mix with the running one marked,
what a pending decision waits for, and each decision as "expected +N % for about M
minutes of this mix, a restart costs S s". `GET /v1/targets/{name}/tuning`, `specfleet
status --target` and the status page's "Why this setting" show it. Pure: memory and
numbers in, dict out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.tuning.store import TunerMemory

KEPT = 20  # decisions kept per target (tuning.json stays small)


def logged(memory: TunerMemory, reason: str, data: dict[str, Any], now: float) -> TunerMemory:
    """The memory with a decision just applied at the end of its log."""
    entry = {"time": round(now, 3), "action": str(data.get("action", "")), "reason": reason,
             "old": data.get("old"), "new": data.get("new"),
             "speculation": bool(data.get("speculation", True)),
             "expected_gain": data.get("expected_gain"),
             "remaining_busy_s": data.get("remaining_busy_s"),
             "switch_cost_s": data.get("switch_cost_s"), "mix": data.get("mix"),
             "predicted": data.get("predicted"), "learning": data.get("learning"),
             "risk_s": data.get("risk_s"), "measuring": data.get("measuring"),
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


def expectation(d: dict[str, Any]) -> str:
    """A decision's expectation in words: "expected +12 % for about 40 minutes of this mix,
    a restart costs 8 s"."""
    gain = d.get("expected_gain")
    minutes = (d.get("remaining_busy_s") or 0) / 60
    switch = d.get("switch_cost_s")
    restart = f", a restart costs {switch:.0f} s" if isinstance(switch, int | float) else ""
    if d.get("learning") is not None and isinstance(d.get("risk_s"), int | float):
        return (f"learning what class {d['learning']!r} accepts where it risks least: at "
                f"the old setting up to {d['risk_s']:.0f} s more if it accepts nothing"
                + restart)
    if d.get("measuring") is not None:
        return (f"measuring what a step costs without speculation at {d['measuring']} "
                "requests running" + restart)
    if not isinstance(gain, int | float):
        return ""
    what = "trying it to learn this mix's acceptance" if d.get("action") == "explore" else \
        f"expected {'+' if gain >= 0 else ''}{100 * gain:.0f} % of busy time saved"
    return f"{what} for about {max(1, round(minutes))} minute(s) of this mix" + restart


def why(view: dict[str, Any], memory: TunerMemory) -> dict[str, Any]:
    """The model behind the running setting; `view`: the tuner's (AutoTuner.view)."""
    cost_view = view.get("cost")
    predicted = [{"setting": name, **{k: p[k] for k in ("low", "mid", "high")},
                  "running": name == view.get("setting")}
                 for name, p in (view.get("predicted") or {}).items()]
    mix = view.get("mix") or {}
    classes = [{"name": name, "share": mix.get(name, 0.0), **acc}
               for name, acc in sorted((view.get("classes") or {}).items(),
                                       key=lambda kv: -mix.get(kv[0], 0.0))]
    return {"running": {"setting": view.get("setting"), "speculation": view.get("setting") != "off"},
            "summary": summary(view),
            "waiting_for": view.get("waiting_for") or waiting(view),
            "cost": None if cost_view is None else {
                "plain_ms": round(cost_view["plain"] * 1e3, 2),
                "step_ms": round(cost_view["step"] * 1e3, 2),
                "per_draft_ms": round(cost_view["per_draft"] * 1e3, 2),
                "per_accepted_ms": round(cost_view["per_accepted"] * 1e3, 2),
                "calibrated": bool(view.get("calibration"))},
            "classes": classes, "predicted": predicted,
            "decisions": [{**d, "cost": cost(d.get("restart")), "expectation": expectation(d)}
                          for d in memory.decisions],
            "checks": view.get("checks") or []}


def waiting(view: dict[str, Any]) -> str | None:
    """What the tuner waits for before it can decide, in words; None when it can."""
    if view.get("needs_calibration"):
        return "the calibration: what a step costs on this machine, measured beside the server"
    if not view.get("predicted"):
        return "traffic: no request has been served since the daemon started"
    return None


def summary(view: dict[str, Any]) -> str:
    """One sentence: the running setting and the prediction it rests on."""
    running = view.get("setting")
    preds = view.get("predicted") or {}
    if not preds:
        return f"runs {running}; " + (waiting(view) or "nothing predicted yet")
    here = preds.get(running, {}).get("mid")
    best = max(preds.items(), key=lambda kv: kv[1]["mid"])
    mix = ", ".join(f"{c} {100 * s:.0f} %" for c, s in sorted(
        (view.get("mix") or {}).items(), key=lambda kv: -kv[1]))
    text = f"runs {running}, predicted {here:.2f}x speculation off for this mix ({mix})" \
        if isinstance(here, int | float) else f"runs {running}"
    if best[0] != running:
        text += f"; {best[0]} is predicted {best[1]['mid']:.2f}x"
    return text
