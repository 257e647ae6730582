"""Predicted speedup of every setting, for each class and for the current mix.

For a class at draft length k, with p the share of steps that carry a draft, d the draft
size (k for a draft model, what the n-gram matches fill of it otherwise), E(k) the
expected accepted tokens of a drafted step (tuning/acceptance.py) and the step costs of
the load (tuning/cost.py):

    tokens per step   = 1 + p · E(k)
    seconds per step  = (1 - p) · t_plain + p · (t_step + t_draft · d + t_accept · E(k))
                        + o · tokens per step
    speedup(k)        = tokens per step · (t_plain + o) / seconds per step

where o is the class's own seconds per token made at any setting (its sampling: a
repetition penalty over a large vocabulary costs the same per token drafted or not), so a
class whose tokens cost more for other reasons gains less from fewer steps.

Off is speedup 1 by definition: its step time is the cost profile's, so "off" needs no
restart to be known. The mix: each class at each load weighted by the busy time its recent
tokens take at off (tokens × (t_plain + o), whatever setting ran); the speedup of the mix
is the weighted harmonic mean, the time the same tokens take. The bounds are each class's
slowest and fastest over its acceptance's bounds, combined the same way (the cost is the
machine's, measured on thousands of steps; its error is checked against measurement instead,
docs/tuning.md).
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
                  fills_length: bool = True, overhead: float = 0.0) -> float:
    """Speedup over off of one class at length k (`z`: its acceptance's bound; `overhead`:
    the class's own seconds per token made, such as its sampling, paid at any setting)."""
    if k == OFF or cost.plain <= 0:
        return 1.0
    p = acc.drafting.bound(z) if not fills_length else 1.0
    draft = k if fills_length else k * acc.draft_fill.mean
    e = acc.accepted(k, z)
    tokens = 1 + p * e
    seconds = (1 - p) * cost.plain + p * cost.drafted(draft, e) + overhead * tokens
    return tokens * (cost.plain + overhead) / seconds


def predict(terms: list[tuple[StepCost, ClassAcceptance, float, float]], settings: list[int],
            fills_length: bool = True) -> dict[int, Prediction]:
    """Every setting's predicted speedup for a mix: `terms` are (the step costs of a load,
    a class's acceptance, its overhead per token, the tokens that class made at that load
    lately)."""
    total = sum(w for *_, w in terms)
    # Weighted by time at off: the tokens times what each costs off.
    off = sum(w * (cost.plain + extra) for cost, _, extra, w in terms) or 1.0
    out: dict[int, Prediction] = {}
    for k in settings:
        if k == OFF or total <= 0:
            out[k] = Prediction(k, 1.0, 1.0, 1.0)
            continue
        shares, spans = [], []
        for cost, acc, extra, w in terms:
            low, mid, high = (class_speedup(cost, acc, k, z, fills_length, extra)
                              for z in (-Z, 0.0, Z))
            # A class's slowest and fastest, not its acceptance's low and high in order: where
            # the share of drafting steps is uncertain (n-gram), more drafting at the upper
            # bound is slower for a class whose drafts do not pay.
            shares.append(w * (cost.plain + extra) / off)
            spans.append((min(low, mid, high), mid, max(low, mid, high)))
        values = []
        for i in range(3):
            slow = sum(share / max(1e-6, span[i]) for share, span in zip(shares, spans, strict=True))
            values.append(1.0 / slow if slow > 0 else 1.0)
        out[k] = Prediction(k, *values)
    return out
