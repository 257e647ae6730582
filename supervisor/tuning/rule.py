"""The decision rule: one function of the model's predictions.

Given the predicted speedup of every setting for the current mix (low, mid and high:
tuning/prediction.py), the setting running now `c`, the expected remaining busy time of
this mix `R` (busy seconds) and what a switch costs `S` (busy seconds of service lost to
the restart), in this order:

0. **Measure off.** If the plain step of the load where the mix spends the most busy time
   was never measured apart from drafts (tuning/cost.py: a speculating server's steps
   cannot tell it), every prediction there rests on a guess of what off costs. Speculation on:
   switch to off to measure it when the mix is expected to last for the way there and
   back and a trial, R > 2 S + TRIAL (an explore, charged like one); already off: keep
   (the next intervals measure it).
1. **Off.** If speculation is on and even the best setting's upper bound is below off
   (max_k high(k) < 1), switch to off when (1 - mid(c)) · R > S, else keep.
2. **Switch.** Let b be the setting with the best mid. The busy time it saves is a share
   g = 1 - mid(c) / low(b) of what the mix would take at c. Switch to b when g · R > S
   and g >= min_gain.
3. **Explore.** Only from off, for a mix whose acceptance is not known (a class never seen
   with speculation on: fewer than `min_steps` drafted steps): let e be the setting with
   the best high. Explore e when high(e) >= 1 + min_gain and what it could save pays for
   the switch and for `TRIAL` busy seconds at its mid (the time to learn the acceptance):
   (1 - 1 / high(e)) · R > S + max(0, 1 / mid(e) - 1) · TRIAL; once per class.
4. Otherwise keep.

A class seen before has its acceptance in the model, so its best setting is predicted at
once, with no search. Nothing here reads a clock or a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.tuning.prediction import OFF, Prediction

KEEP, SWITCH, EXPLORE = "keep", "switch", "explore"
TRIAL = 30.0  # busy seconds a tried setting serves before its acceptance is known


@dataclass(frozen=True)
class Decision:
    action: str
    setting: int
    reason: str
    expected_gain: float = 0.0  # share of busy time saved (mid, not the bound)
    data: dict[str, Any] = field(default_factory=dict)


def describe(setting: int) -> str:
    return "off" if setting == OFF else f"n={setting}"


def decide(predictions: Mapping[int, Prediction], current: int, remaining: float,
           switch_cost: float, min_gain: float, unknown: bool,
           unmeasured: str | None = None) -> Decision:
    """The rule above; `unknown`: the mix's acceptance is not known (rule 3);
    `unmeasured`: the load (a bucket's label) of the mix whose plain step is not (rule 0)."""
    cur = predictions[current].mid if current in predictions else 1.0
    speculative = [p for k, p in predictions.items() if k != OFF]
    numbers = {"predicted": {describe(k): p.to_dict() for k, p in predictions.items()},
               "remaining_busy_s": round(remaining, 1), "switch_cost_s": round(switch_cost, 1)}
    if unmeasured is not None:
        what = f"what a step costs without speculation at {unmeasured} requests running"
        if current == OFF:
            return Decision(KEEP, OFF, f"measuring {what}", 0.0,
                            {**numbers, "measuring": unmeasured})
        if remaining > 2 * switch_cost + TRIAL:
            return Decision(EXPLORE, OFF, f"{what} was never measured (a plain step beside "
                            "drafts costs what their batch costs): serving off to measure it",
                            0.0, {**numbers, "measuring": unmeasured})
    if current != OFF and speculative and max(p.high for p in speculative) < 1.0:
        saved = (1 - cur) * remaining
        if saved > switch_cost:
            return Decision(SWITCH, OFF, f"every setting's best case is below off (at most "
                            f"{max(p.high for p in speculative):.2f}x): speculation off",
                            1 - cur, numbers)
        return Decision(KEEP, current, "speculation loses here but a restart costs more than "
                        "the rest of this mix would lose", 0.0, numbers)
    if current == OFF and unknown and speculative:
        e = max(speculative, key=lambda p: (p.high, p.setting))
        trial = max(0.0, 1 / e.mid - 1) * TRIAL if e.mid > 0 else TRIAL
        if e.high >= 1 + min_gain and (1 - 1 / e.high) * remaining > switch_cost + trial:
            return Decision(EXPLORE, e.setting, f"acceptance of this mix unknown: trying "
                            f"{describe(e.setting)} (at best {e.high:.2f}x)", 0.0, numbers)
    best = max(predictions.values(), key=lambda p: (p.mid, -p.setting))
    if best.setting == current:
        return Decision(KEEP, current, f"{describe(current)} is predicted best", 0.0, numbers)
    low = best.low if best.setting != OFF else 1.0
    gain = 1 - cur / low if low > 0 else 0.0
    if gain >= min_gain and gain * remaining > switch_cost:
        return Decision(SWITCH, best.setting, f"{describe(best.setting)} predicted "
                        f"{best.mid:.2f}x against {cur:.2f}x now", 1 - cur / best.mid, numbers)
    return Decision(KEEP, current, f"{describe(best.setting)} may be better but its sure gain "
                    f"({max(gain, 0.0):.0%}) does not pay the switch over this mix", 0.0,
                    numbers)
