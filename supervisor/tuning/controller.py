"""The tuner's core: estimators fed with intervals, the rule asked for a decision.

One `TuningController` per target. Fed every interval of service (`observe`: what the
runtime's counters moved, the busy seconds, the load, the tokens each class of request
made), it keeps

- the cost profile: a `CostFit` per load bucket (tuning/cost.py), seeded by a
  calibration and refined by every interval;
- the acceptance of each class (tuning/acceptance.py), from the intervals one class
  made (at least `PURE` of the tokens; mixed ones teach the cost only);
- the mix: the tokens of each (load, class) lately, fading with a half-life of
  the latest `MIX_TOKENS`, cut where a new mix began (its newest tokens far from the
  rest's shares and unlikely draws from them), and how long this mix has lasted in busy
  seconds.

`decide` predicts every setting for the mix (tuning/prediction.py) and applies the rule
(tuning/rule.py) with R, the expected remaining busy time of this mix: the longest of
what it has lasted so far, what its main class lasted the last times it came
(`stretch`), and `MIN_HORIZON`. While a new mix forms nothing is decided, except off at
once for known classes that lose at every setting (`_off_at_once`); and a request of
such a class that arrives after a mix without it turns speculation off before it is
served, one of a class never seen the shortest length (`arriving`, asked by the proxy).
The same object runs in the daemon (tuning/autotuner.py) and in the trace simulator
(benchmarks/trace_sim.py), on a clock it is given. After a switch, once the new setting
has made `CHECK_TOKENS` tokens, the measured speedup of the mix is set beside the one
predicted (`checks`). Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from supervisor.tuning.acceptance import ClassAcceptance, pooled
from supervisor.tuning.cost import CostFit, Interval, StepCost
from supervisor.tuning.load import LABELS as BUCKETS
from supervisor.tuning.load import bucket_of
from supervisor.tuning.prediction import OFF, Prediction, predict
from supervisor.tuning.rule import EXPLORE, KEEP, SWITCH, Decision, decide, describe

PURE = 0.8
RESIDUAL_HALF_LIFE = 5000.0  # tokens
MIX_TOKENS = 2400.0  # the mix: about the last twelve answers of 192 tokens
CHANGE_TOKENS = 600.0  # the newest tokens compared with the rest for a change of mix
MIN_HORIZON = 120.0  # busy seconds a new mix is expected to last at least
MAX_HORIZON = 3600.0
NEW_MIX = 0.6  # the newest tokens' classes this far from the rest's: a new mix
# ... and that unlikely to come from the rest's shares: a G-test at p = 0.001 (one degree
# of freedom), counting ANSWER_TOKENS tokens as one answer (the proxy counts tokens). Three
# answers of a class with a fifth of a mixed segment's traffic came in a row in two seeds of
# the simulated day; the distance alone read that as a new mix and turned off within it.
CHANGE_G = 10.8
ANSWER_TOKENS = 200.0
CHECK_TOKENS = 1500
MIN_EVIDENCE_STEPS = 60  # drafted steps at a new setting before it is judged again


MixEntry = tuple[str, dict[str, float], float]


@dataclass(frozen=True)
class Observation:
    """One interval of service at the setting running (`setting`: OFF or a length)."""

    interval: Interval
    setting: int
    load: int
    per_position: Sequence[float] = ()
    class_tokens: Mapping[str, float] = field(default_factory=dict)


@dataclass
class TuningController:
    lengths: list[int]
    current: int
    min_gain: float = 0.05
    min_steps: int = 200
    fills_length: bool = True  # draft models draft k; n-gram methods what they match
    costs: dict[str, CostFit] = field(default_factory=dict)
    classes: dict[str, ClassAcceptance] = field(default_factory=dict)
    # The latest intervals of the mix: (load bucket, tokens by class, busy seconds).
    recent: deque[MixEntry] = field(default_factory=deque)
    lasted: float = 0.0  # busy seconds since this mix began
    stretch: dict[str, float] = field(default_factory=dict)
    explored: set[str] = field(default_factory=set)
    # Each class's seconds beyond what the step costs explain, and its tokens (fading).
    residuals: dict[str, tuple[float, float]] = field(default_factory=dict)
    since_switch: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("tokens", "seconds", "off_seconds", "drafted"), 0.0))
    expected: float | None = None  # the mix's predicted speedup at the last switch
    checks: list[dict[str, Any]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """What is worth keeping across daemon restarts (the mix is not: it is today's)."""
        return {"costs": {b: f.to_dict() for b, f in self.costs.items()},
                "classes": {c: a.to_dict() for c, a in self.classes.items()},
                "stretch": {c: round(s, 1) for c, s in self.stretch.items()},
                "residuals": {c: [round(s, 4), round(t, 1)] for c, (s, t) in
                              self.residuals.items()},
                "explored": sorted(self.explored)}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Take back `state()`; a part that does not parse is dropped, not fatal."""
        try:
            self.costs = {b: CostFit.from_dict(f) for b, f in data.get("costs", {}).items()}
            self.classes = {c: ClassAcceptance.from_dict(a)
                            for c, a in data.get("classes", {}).items()}
            self.stretch = {c: float(s) for c, s in data.get("stretch", {}).items()}
            self.explored = set(data.get("explored", ()))
            self.residuals = {c: (float(s), float(t))
                              for c, (s, t) in data.get("residuals", {}).items()}
        except (TypeError, ValueError, KeyError, IndexError):
            self.costs, self.classes, self.stretch, self.explored = {}, {}, {}, set()
            self.residuals = {}

    def forget_costs(self) -> None:
        """The model file or runtime changed: what a step cost is measured again."""
        self.costs = {}

    def calibrated(self, costs: Mapping[str, StepCost], shaped: bool = True) -> None:
        """A calibration's costs by load bucket as the priors of the buckets; a bucket it
        did not measure takes the nearest one's. What each bucket served since is kept
        (and rescales it, where the calibration measured drafted steps: `shaped`)."""
        if not costs:
            return
        for b in BUCKETS:
            i = BUCKETS.index(b)
            near = min(costs, key=lambda c: abs(BUCKETS.index(c) - i))
            self.costs[b] = replace(self.costs.get(b) or CostFit(), prior=costs[near],
                                    shaped=shaped, plain_measured=b in costs)

    def cost(self, bucket: str) -> StepCost | None:
        """The bucket's cost, else the nearest bucket's with data."""
        i = BUCKETS.index(bucket)
        for b in sorted(BUCKETS, key=lambda b: abs(BUCKETS.index(b) - i)):
            if b in self.costs and (c := self.costs[b].solve()) is not None:
                return c
        return None

    def observe(self, obs: Observation) -> None:
        iv = obs.interval
        bucket = bucket_of(obs.load)
        total = sum(obs.class_tokens.values())
        main = max(obs.class_tokens, key=lambda c: obs.class_tokens[c]) if total > 0 else None
        pure = main is not None and obs.class_tokens[main] >= PURE * total
        # A class's own cost per token is read where the step model is exact, from plain
        # steps only (off, or an n-gram drafter that found nothing): read beside drafted
        # steps, any error of the drafted parts became one class's "overhead", which was
        # taken off the seconds the cost is fitted on, which moved the error further.
        if pure and iv.drafted_steps <= 0 and (cost := self.cost(bucket)) is not None \
                and cost.plain > 0:
            self._residual(main, iv, cost)
        # The step costs are the cheapest class's: what the others add per token is theirs.
        extra = sum(self.overhead(c) * n / total for c, n in obs.class_tokens.items()) \
            if total > 0 else 0.0
        self.costs.setdefault(bucket, CostFit(self.cost(bucket))).add(
            replace(iv, seconds=max(iv.seconds * 0.05, iv.seconds - extra * iv.tokens)),
            alone=bucket == BUCKETS[0])
        if main is None:
            return
        if obs.setting != OFF and pure:
            acc = self.classes.get(main, ClassAcceptance())
            self.classes[main] = acc.observe(obs.setting, iv.drafted_steps, obs.per_position,
                                             iv.tokens - iv.accepted_tokens, iv.draft_tokens)
        self.recent.append((bucket, dict(obs.class_tokens), iv.seconds))
        self._follow_mix()
        s = self.since_switch
        s["tokens"] += iv.tokens
        s["seconds"] += iv.seconds
        s["drafted"] += iv.drafted_steps
        if (cost := self.cost(bucket)) is not None:  # what these tokens would take off
            s["off_seconds"] += (cost.plain + extra) * iv.tokens
        self._check()

    def _residual(self, cls: str, iv: Interval, cost: StepCost) -> None:
        """What this class's tokens cost beyond the steps (its sampling), fading."""
        steps = cost.plain * iv.plain_steps + iv.drafted_steps * cost.step + \
            cost.per_draft * iv.draft_tokens + cost.per_accepted * iv.accepted_tokens
        seconds, tokens = self.residuals.get(cls, (0.0, 0.0))
        fade = 0.5 ** (iv.tokens / RESIDUAL_HALF_LIFE)
        self.residuals[cls] = (seconds * fade + iv.seconds - steps, tokens * fade + iv.tokens)

    def overhead(self, cls: str) -> float:
        """A class's own seconds per token over the cheapest class's (0 for that one and for
        a class not seen in an interval of its own)."""
        rates = {c: s / t for c, (s, t) in self.residuals.items() if t > 0}
        if cls not in rates:
            return 0.0
        return max(0.0, rates[cls] - min(rates.values()))

    def shares(self, intervals: Sequence[MixEntry] | None = None) -> dict[str, float]:
        by_class = _tokens(self.recent if intervals is None else intervals)
        total = sum(by_class.values()) or 1.0
        return {c: w / total for c, w in by_class.items()}

    def _split(self) -> tuple[list[MixEntry], list[MixEntry], float]:
        """The mix's newest entries (up to CHANGE_TOKENS), the rest, and their distance."""
        entries = list(self.recent)
        newest, count = 0, 0.0
        while newest < len(entries) and count < CHANGE_TOKENS:
            newest += 1
            count += sum(entries[-newest][1].values())
        if not entries[:-newest]:
            return entries, [], 0.0
        moved = _distance(self.shares(entries[-newest:]), self.shares(entries[:-newest]))
        return entries[-newest:], entries[:-newest], moved

    def _follow_mix(self) -> None:
        """Keep the latest MIX_TOKENS of the mix; when its newest CHANGE_TOKENS differ from
        the rest by more than NEW_MIX and could hardly be drawn from the rest's shares
        (`_unlikely`), a new mix began there: the rest is dropped (it would bend the
        prediction towards the mix that ended) and the old mix's main class notes how long
        it lasted."""
        newest, older, moved = self._split()
        self.lasted += newest[-1][2]
        new_tokens, old_tokens = _tokens(newest), _tokens(older)
        if moved > NEW_MIX and sum(new_tokens.values()) >= CHANGE_TOKENS \
                and sum(old_tokens.values()) >= CHANGE_TOKENS \
                and _unlikely(new_tokens, old_tokens):
            old, new = self.shares(older), self.shares(newest)
            # The change is where the entries start to look like the new mix.
            while len(newest) > 1 and _distance(self.shares(newest[:1]), old) < \
                    _distance(self.shares(newest[:1]), new):
                older, newest = older + newest[:1], newest[1:]
            main = max(old, key=lambda c: old[c])
            new_seconds = sum(sec for _, _, sec in newest)
            lasted = self.lasted - new_seconds
            prev = self.stretch.get(main)
            self.stretch[main] = lasted if prev is None else (prev + lasted) / 2
            # The first entry of the new mix straddles the change: it holds the old mix's
            # last answers too, which would bend the first prediction of the new one.
            self.recent, self.lasted = deque(newest[1:] if len(newest) > 1 else newest), \
                new_seconds
        while sum(sum(t.values()) for _, t, _ in list(self.recent)[1:]) >= MIX_TOKENS:
            self.recent.popleft()

    def changing(self) -> bool:
        """Whether the latest interval differs from the rest as a new mix would, before
        there are CHANGE_TOKENS of it to say so: no decision until that is settled."""
        if len(self.recent) < 2:
            return False
        entries = list(self.recent)
        return _distance(self.shares(entries[-1:]), self.shares(entries[:-1])) > NEW_MIX

    def main_class(self) -> str | None:
        shares = self.shares()
        return max(shares, key=lambda c: shares[c]) if shares else None

    def remaining(self) -> float:
        main = self.main_class()
        seen = self.stretch.get(main, 0.0) - self.lasted if main else 0.0
        return min(MAX_HORIZON, max(self.lasted, seen, MIN_HORIZON))

    def predictions(self, entries: Sequence[MixEntry] | None = None
                    ) -> dict[int, Prediction] | None:
        """Every setting's prediction for the mix (`entries`: these of it only), from the
        loads whose plain step is known where there are any: elsewhere a speculating
        server's fit may put the plain step anywhere, near 0 included, and the mix's
        harmonic mean lets a few such intervals set every setting's prediction."""
        terms = []
        unseen = pooled(list(self.classes.values()))
        chosen = list(self.recent if entries is None else entries)
        known = [e for e in chosen if self.plain_known(e[0])]
        for bucket, tokens, _ in known or chosen:
            cost = self.cost(bucket)
            if cost is None:
                return None
            terms += [(cost, self.classes.get(c, unseen), self.overhead(c), n)
                      for c, n in tokens.items()]
        if not terms:
            return None
        return predict(terms, [OFF, *self.lengths], self.fills_length)

    def unknown(self) -> bool:
        """Whether the mix's main classes have no acceptance measured yet."""
        shares = self.shares()
        return any(self.classes.get(c, ClassAcceptance()).steps < self.min_steps
                   for c, s in shares.items() if s >= 0.2)

    def plain_known(self, bucket: str) -> bool:
        """Whether the plain step at this load is known (tuning/cost.py), or lies between
        two loads where it is (2-3 requests between a calibration's 1 and 4)."""
        known = [i for i, b in enumerate(BUCKETS) if b in self.costs and
                 self.costs[b].plain_known]
        return bool(known) and min(known) <= BUCKETS.index(bucket) <= max(known)

    def unmeasured(self) -> str | None:
        """The load where the mix spends the most busy time, if its plain step is not
        known; None otherwise."""
        seconds: dict[str, float] = {}
        for bucket, _, sec in self.recent:
            seconds[bucket] = seconds.get(bucket, 0.0) + sec
        if not seconds:
            return None
        busiest = max(seconds, key=lambda b: seconds[b])
        return None if self.plain_known(busiest) else busiest

    def decide(self, switch_cost: float, only_off: bool = False) -> Decision | None:
        """The rule's decision now; None while the model cannot predict (no cost measured,
        no traffic seen) or the setting has just changed and shows too little yet.
        `only_off`: the drafted steps' cost is not calibrated yet, so another length's
        prediction is a guess; turning a losing setting off is not (it rests on what the
        running setting served and the plain step)."""
        if self.current != OFF and self.since_switch["drafted"] < MIN_EVIDENCE_STEPS \
                and self.since_switch["tokens"] < CHECK_TOKENS:
            return None
        if self.changing():
            return self._off_at_once(switch_cost)
        preds = self.predictions()
        if preds is None:
            return None
        # A class explored once is not explored again: what it showed is its acceptance.
        unknown = self.unknown() and self.main_class() not in self.explored
        if only_off:  # the running setting against off: the two that rest on measurement
            preds = {k: p for k, p in preds.items() if k in (OFF, self.current)}
        d = decide(preds, self.current, self.remaining(), switch_cost, self.min_gain, unknown,
                   self.unmeasured())
        d.data["mix"] = self.rounded_shares()
        # Before the lengths are calibrated, off only where the running setting loses by
        # more than min_gain even at its best: off is sticky (from off, a length must gain
        # min_gain at its lower bound to pay its restart), and a setting that loses a
        # little may sit beside a length that wins by much (a short length just below off,
        # a long one well above it on code): turned off before the lengths are in, a day
        # of code would be served off.
        if only_off and "measuring" not in d.data and (
                d.setting != OFF or preds[self.current].high > 1 - self.min_gain):
            return Decision(KEEP, self.current, "waiting for the calibration's drafted steps",
                            data=d.data)
        return d

    def _off_at_once(self, switch_cost: float) -> Decision | None:
        """While a new mix forms, nothing is decided until it has CHANGE_TOKENS, with one
        exception: speculation on, and the newest interval's classes, each with its
        acceptance known (`min_steps` drafted steps: with fewer, one seed of the simulated
        day turned off and back within segments it had seen), lose at every setting even
        at their best case. Then off pays over MIN_HORIZON and waiting would not (prose
        after code at n=16 serves at about 0.2x off: the three answers it took to settle
        were most of what the simulated day lost to the oracle). A lone answer of such a
        class inside another mix costs two restarts (off, then back once the mix says so)."""
        if not self.recent:
            return None
        return self._off_for(list(self.recent)[-1:], switch_cost)

    def arriving(self, cls: str, load: int, switch_cost: float, only_off: bool = False
                 ) -> Decision | None:
        """A request of class `cls` arrives, `load` requests in flight with it. Only for a
        class the mix does not hold at all (in a mix of several classes the mix decides:
        acting on each arrival would restart at each change of class), and only while
        speculation is on: its acceptance known, off before it is served where
        `_off_at_once` would turn off after it; its acceptance unknown, the shortest length
        while it is learnt, where what its worst case could cost at the running length
        pays for two restarts (`_hedge`; not `only_off`: the drafted steps' cost is not
        calibrated yet)."""
        if self.current == OFF or self.shares().get(cls, 0.0) > 0:  # (every request asks)
            return None
        if self.classes.get(cls, ClassAcceptance()).steps >= self.min_steps:
            return self._off_for([(bucket_of(load), {cls: 1.0}, 0.0)], switch_cost)
        return None if only_off else self._hedge(cls, load, switch_cost)

    def _hedge(self, cls: str, load: int, switch_cost: float) -> Decision | None:
        """A class never seen is served to learn what it accepts: `min_steps` drafted
        steps. At the running length c a text that accepts nothing makes one token a step
        and pays for c draft tokens each: the first prose after code at n=16 served at
        about a tenth of off on the pair. p0 and rho are identified at any length >= 2
        (tuning/acceptance.py), so the shortest such length q learns the same at little
        risk. Switch to q when what learning at c could cost beyond learning at q, at
        worst, exceeds two restarts (to q, then to the class's best):
        min_steps · (step(c) - step(q)) > 2 S, each step at acceptance 0. Draft models
        only: an n-gram drafter drafts where the text matches, so a text it cannot
        predict costs it little."""
        probe = [k for k in self.lengths if k >= 2]
        cost = self.cost(bucket_of(load))
        if not self.fills_length or not probe or cost is None or \
                min(probe) >= self.current or cls in self.explored:
            return None
        q = min(probe)
        at_q, at_c = cost.drafted(q, 0.0), cost.drafted(self.current, 0.0)
        risk = self.min_steps * (at_c - at_q)
        if risk <= 2 * switch_cost:
            return None
        return Decision(SWITCH, q, f"class {cls!r} never seen: its acceptance is learnt at "
                        f"n={q}, where a text that accepts nothing costs "
                        f"{at_q / cost.plain:.1f}x a plain step, not at n={self.current} "
                        f"({at_c / cost.plain:.1f}x)",
                        data={"mix": {cls: 1.0}, "learning": cls, "risk_s": round(risk, 1),
                              "switch_cost_s": round(switch_cost, 1)})

    def _off_for(self, entries: list[MixEntry], switch_cost: float) -> Decision | None:
        """Rule 1 for these entries alone over MIN_HORIZON, if speculation is on and their
        classes' acceptance is known and loses at every setting (None otherwise)."""
        if self.current == OFF or any(
                self.classes.get(c, ClassAcceptance()).steps < self.min_steps
                for _, tokens, _ in entries for c in tokens):
            return None
        preds = self.predictions(entries)
        if preds is None or max(p.high for k, p in preds.items() if k != OFF) >= 1.0:
            return None
        d = decide(preds, self.current, MIN_HORIZON, switch_cost, self.min_gain, False)
        if d.setting != OFF:
            return None
        d.data["mix"] = self.rounded_shares(entries)
        return d

    def rounded_shares(self, entries: Sequence[MixEntry] | None = None) -> dict[str, float]:
        """The mix's shares as a decision's event carries them."""
        return {c: round(s, 3) for c, s in self.shares(entries).items()}

    def switched(self, decision: Decision) -> None:
        """The decision's setting now runs (the caller restarted the server)."""
        if decision.action == KEEP:
            return
        if decision.action == EXPLORE and decision.setting != OFF and \
                (main := self.main_class()) is not None:
            self.explored.add(main)
        if "learning" in decision.data:  # hedged once (`_hedge`): then served like any class
            self.explored.add(decision.data["learning"])
        preds = decision.data.get("predicted", {})
        got = preds.get(describe(decision.setting))
        self.expected = got["mid"] if got else None
        self.current = decision.setting
        self.since_switch = dict.fromkeys(self.since_switch, 0.0)

    def _check(self) -> None:
        s = self.since_switch
        if self.expected is None or s["tokens"] < CHECK_TOKENS:
            return
        if s["seconds"] > 0 and s["off_seconds"] > 0:
            self.checks.append({"setting": self.current, "predicted": self.expected,
                                "measured": round(s["off_seconds"] / s["seconds"], 3)})
        self.expected = None


def _distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Half the L1 distance of two mixes' shares: 0 the same, 1 nothing in common."""
    # Sorted: a sum over a set follows the hash seed, and a tie at a threshold then would too.
    return sum(abs(a.get(c, 0.0) - b.get(c, 0.0)) for c in sorted(set(a) | set(b))) / 2


def _tokens(entries: Sequence[MixEntry] | deque[MixEntry]) -> dict[str, float]:
    """The entries' tokens by class."""
    out: dict[str, float] = {}
    for _, tokens, _ in entries:
        for cls, n in tokens.items():
            out[cls] = out.get(cls, 0.0) + n
    return out


def _unlikely(new: Mapping[str, float], old: Mapping[str, float]) -> bool:
    """Whether `new`'s tokens by class are unlikely draws from `old`'s shares: the G
    statistic (twice the log-likelihood ratio of their own shares over old's) above
    CHANGE_G, in answers of ANSWER_TOKENS; old's shares take half an answer of every
    class, so that one never seen there is unlikely, not impossible."""
    classes = set(new) | set(old)
    total = sum(old.values()) + 0.5 * ANSWER_TOKENS * len(classes)
    count = sum(new.values())
    g = 0.0
    for cls, n in new.items():
        if n > 0:
            p = (old.get(cls, 0.0) + 0.5 * ANSWER_TOKENS) / total
            g += 2 * (n / ANSWER_TOKENS) * math.log(n / (count * p))
    return g > CHANGE_G
