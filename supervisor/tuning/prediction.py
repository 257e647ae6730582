"""Predicted speedup of every setting, for each class and for the current mix.

For a class at draft length k, with p the share of steps that carry a draft, d the draft
size (k for a draft model, what the n-gram matches fill of it otherwise), E(k) the
expected accepted tokens of a drafted step (tuning/acceptance.py) and the step costs of
the load (tuning/cost.py):

    tokens per step   = 1 + p · E(k)
    seconds per step  = (1 - p) · t_plain + p · (t_step + t_draft · d + t_accept · E(k))
    speedup(k)        = tokens per step · t_plain / seconds per step

Off is speedup 1 by definition: its step time is the cost profile's, so "off" needs no
restart to be known. The mix: each class at each load weighted by the tokens it made lately (their busy
time at off, whatever setting ran), the speedup of the mix is the weighted harmonic mean
(the time the same tokens take).
The bounds come from the acceptance's bounds (the cost is the machine's, measured on
thousands of steps; its error is checked against measurement instead, docs/tuning.md).
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.tuning.acceptance import ClassAcceptance, Z
from supervisor.tuning.cost import StepCost

OFF = 0  # the setting "no speculation"; any other setting is a draft length


@dataclass(frozen=True)
class Prediction:
    setting: int
    low: float
    mid: float
    high: float

    def to_dict(self) -> dict[str, float | int]:
        return {"setting": self.setting, "low": round(self.low, 3), "mid": round(self.mid, 3),
                "high": round(self.high, 3)}


def class_speedup(cost: StepCost, acc: ClassAcceptance, k: int, z: float = 0.0,
                  fills_length: bool = True) -> float:
    """Speedup over off of one class at length k (`z`: its acceptance's bound)."""
    if k == OFF or cost.plain <= 0:
        return 1.0
    p = acc.drafting.bound(z) if not fills_length else 1.0
    draft = k if fills_length else k * acc.draft_fill.mean
    e = acc.accepted(k, z)
    seconds = (1 - p) * cost.plain + p * cost.drafted(draft, e)
    return (1 + p * e) * cost.plain / seconds


def predict(terms: list[tuple[StepCost, ClassAcceptance, float]], settings: list[int],
            fills_length: bool = True) -> dict[int, Prediction]:
    """Every setting's predicted speedup for a mix: `terms` are (the step costs of a load,
    a class's acceptance, the tokens that class made at that load lately)."""
    total = sum(w for _, _, w in terms)
    out: dict[int, Prediction] = {}
    for k in settings:
        values = []
        for z in (-Z, 0.0, Z):
            if k == OFF or total <= 0:
                values.append(1.0)
                continue
            # Tokens at off take busy time in proportion to them; at k, that over the speedup.
            slow = sum(w / total / class_speedup(cost, acc, k, z, fills_length)
                       for cost, acc, w in terms)
            values.append(1.0 / slow)
        out[k] = Prediction(k, *values)
    return out
