"""What a class of requests accepts: the text half of the tuner's model.

For drafted steps at length k the runtime counts, per draft position i, the steps whose
draft was accepted at least up to i (`accepted_per_position`). The model:

    P(position 0 accepted)               = p0
    P(position i accepted | i-1 was)     = rho         (i >= 1)
    expected accepted tokens at length k = p0 · (1 + rho + ... + rho^(k-1))

Two numbers per class, each a proportion with a Beta(1, 1) prior: p0 from steps and
first-position acceptances, rho from each position's acceptances over the previous
position's. Both are identified at any length k >= 2, so lengths never run can be
predicted from any one that ran; how far off that is on real text is measured (docs/tuning.md,
"The model against measurement"). Counts fade with a half-life in steps, so a class
whose text changes follows it. Uncertainty: each proportion's standard error, the bounds
`z` of them away (z = 1.64: a one-sided 95 % bound).

A class is what the proxy can tell of a request before any token: greedy or sampled,
the endpoint, and a name the client may send (`CLASS_HEADER`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HALF_LIFE_STEPS = 4000.0
Z = 1.64
PRIOR_STEPS = 20.0  # the weight of the other classes' acceptance for a class never seen
# At or under this temperature a request is greedy: llama.cpp and vLLM take the most likely
# token at 0, and 0.05 is as good as greedy for what a draft can predict.
GREEDY_TEMPERATURE = 0.05
CLASS_HEADER = "X-Specfleet-Class"
MAX_NAME = 64  # a class named by a client is cut to this (it becomes a key in tuning.json)


@dataclass(frozen=True)
class Rate:
    hits: float = 0.0
    tries: float = 0.0

    @property
    def mean(self) -> float:
        # Hits and tries may come from different intervals (below): never above 1.
        return min(1.0, (self.hits + 1.0) / (self.tries + 2.0))

    def bound(self, z: float) -> float:
        """The mean `z` standard errors away (negative z: below), within [0, 1]."""
        m = self.mean
        return min(1.0, max(0.0, m + z * math.sqrt(m * (1 - m) / (self.tries + 3.0))))

    def faded(self, factor: float) -> Rate:
        return Rate(self.hits * factor, self.tries * factor)


@dataclass(frozen=True)
class ClassAcceptance:
    """One class's acceptance: p0, rho, and the share of steps that carry a draft."""

    first: Rate = Rate()   # position 0 over drafted steps
    onward: Rate = Rate()  # position i over position i-1
    drafting: Rate = Rate()  # drafted steps over all steps (n-gram drafts only on a match)
    draft_fill: Rate = Rate()  # draft tokens over k · drafted steps (a draft's share of k)

    @property
    def steps(self) -> float:
        return self.first.tries

    def observe(self, k: int, drafted_steps: float, per_position: Sequence[float],
                steps: float, draft_tokens: float) -> ClassAcceptance:
        """Add one interval at draft length `k` (`steps`: all its steps, drafted or not)."""
        if k <= 0 or (steps <= 0 and drafted_steps <= 0):
            return self
        # The share of steps that draft, over all steps, intervals with no draft included
        # (an n-gram drafter that found no match: without them a class that never drafts
        # keeps the prior's one step in two and pays for drafts it never makes). Summed
        # over intervals, not clipped per interval: vLLM moves its draft counters and its
        # token counter at different moments, so one scrape may show the drafts and the
        # next the tokens they made.
        d = self.drafting.faded(0.5 ** (max(steps, 0.0) / HALF_LIFE_STEPS))
        drafting = Rate(d.hits + max(drafted_steps, 0.0), d.tries + max(steps, 0.0))
        if drafted_steps <= 0:
            return ClassAcceptance(self.first, self.onward, drafting, self.draft_fill)
        factor = 0.5 ** (drafted_steps / HALF_LIFE_STEPS)
        pos = [float(per_position[i]) if i < len(per_position) else 0.0 for i in range(k)]
        hits = sum(pos[1:])
        tries = sum(pos[:-1])
        f, o, fill = (r.faded(factor) for r in (self.first, self.onward, self.draft_fill))
        return ClassAcceptance(
            Rate(f.hits + pos[0], f.tries + drafted_steps),
            Rate(o.hits + hits, o.tries + tries),
            drafting,
            Rate(fill.hits + draft_tokens, fill.tries + k * drafted_steps))

    def accepted(self, k: int, z: float = 0.0) -> float:
        """Expected accepted tokens of a drafted step at length k, `z` standard errors up."""
        p0, rho = self.first.bound(z), self.onward.bound(z)
        if rho >= 1.0:
            return p0 * k
        return p0 * (1 - rho ** k) / (1 - rho)

    def to_dict(self) -> dict[str, Any]:
        return {name: [round(r.hits, 3), round(r.tries, 3)] for name, r in
                (("first", self.first), ("onward", self.onward), ("drafting", self.drafting),
                 ("draft_fill", self.draft_fill))}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassAcceptance:
        return cls(*(Rate(*map(float, data.get(n, (0.0, 0.0)))) for n in
                     ("first", "onward", "drafting", "draft_fill")))

    def view(self) -> dict[str, Any]:
        """For status and the page: the two numbers, their bounds and the evidence."""
        return {"p0": round(self.first.mean, 3), "p0_low": round(self.first.bound(-Z), 3),
                "p0_high": round(self.first.bound(Z), 3), "rho": round(self.onward.mean, 3),
                "rho_low": round(self.onward.bound(-Z), 3),
                "rho_high": round(self.onward.bound(Z), 3),
                "drafting": round(self.drafting.mean, 3), "steps": round(self.steps)}


def pooled(classes: Sequence[ClassAcceptance], weight: float = PRIOR_STEPS) -> ClassAcceptance:
    """What a class never seen is expected to accept: all the classes seen, pooled and
    shrunk to `weight` drafted steps of evidence (a draft that loses on every class seen
    is not tried on a new one on the hope of a uniform prior; one that wins is)."""
    total = sum(c.first.tries for c in classes)
    if total <= 0:
        return ClassAcceptance()
    f = min(1.0, weight / total)

    def pool(name: str) -> Rate:
        rates = [getattr(c, name) for c in classes]
        return Rate(sum(r.hits for r in rates) * f, sum(r.tries for r in rates) * f)
    return ClassAcceptance(pool("first"), pool("onward"), pool("drafting"), pool("draft_fill"))


def class_of(greedy: bool | None, endpoint: str, named: str | None = None) -> str:
    """The class a request belongs to: the client's name for it if it gave one, else
    its sampling and endpoint ("greedy /completion", "sampled /v1/chat/completions")."""
    if named:
        return named[:MAX_NAME]
    sampling = "greedy" if greedy else "sampled" if greedy is False else "default"
    return f"{sampling} {endpoint}"


def request_class(body: Mapping[str, Any], endpoint: str, named: str | None = None) -> str:
    """The class of a request the proxy relays (its JSON body, its path, the value of its
    CLASS_HEADER): greedy at a `temperature` of at most GREEDY_TEMPERATURE, sampled above,
    "default" without one (the runtime's default, which specfleet does not know)."""
    t = body.get("temperature")
    greedy = None if isinstance(t, bool) or not isinstance(t, int | float) \
        else t <= GREEDY_TEMPERATURE
    return class_of(greedy, endpoint, named)
