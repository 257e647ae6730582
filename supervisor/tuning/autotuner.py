"""AutoTuner: one target's tuner, between its counters, its requests and its restarts.

The owner feeds it every metrics sample with what the proxy saw meanwhile (`observe`: the
load, and the tokens each class of request made), which may return the reason for a
restart; calls `apply_pending` just before that restart and `restarted` once the new
server is ready. Everything it decides, it decides with the controller
(tuning/controller.py): the cost of a step from the calibration (`calibrated`, run by the
owner before the first decision: tuning/calibration.py) refined by serving, each class's
acceptance, the predicted speedup of every setting for the mix, the one rule. A decision
waits for an idle server at most `tuning.max_wait` (the restart then interrupts nothing)
unless the restart costs no service (beside the old server).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from supervisor.config.schema import Target
from supervisor.plugin.backend import Backend, MetricsSample, RuntimeInfo
from supervisor.tuning import evidence
from supervisor.tuning.controller import Observation, TuningController
from supervisor.tuning.cost import Interval, StepCost
from supervisor.tuning.load import LoadWindows
from supervisor.tuning.prediction import OFF
from supervisor.tuning.rule import KEEP, Decision, describe
from supervisor.tuning.store import TunerMemory, TuningStore, fingerprint, runtime_key
from supervisor.tuning.window import AcceptanceWindow, Delta, WindowStats, merged

EventSink = Callable[..., None]  # (kind, reason, **data)
UNCLASSIFIED = "unclassified"  # tokens of requests that did not pass through the proxy
# What a restart in place costs before one was timed (a model load of a few GB).
ASSUMED_RESTART_S = 30.0
# A restart beside the old server loses no request; it costs the old server the cores the
# new one loads on (on a CPU) for the time it loads: counted as half of that time.
BESIDE_SHARE = 0.5
SAVE_EVERY = 20  # observations between two saves of what was learnt


class AutoTuner:
    def __init__(self, target: Target, backend: Backend, store: TuningStore | None,
                 emit: EventSink, clock: Callable[[], float] = time.monotonic,
                 restart_is_free: bool = False) -> None:
        self.target = target
        self.backend = backend
        self.store = store
        self.emit = emit
        self.clock = clock
        self.window = AcceptanceWindow(max_steps=target.tuning.window_steps)
        self.by_load = LoadWindows(max_steps=target.tuning.window_steps)
        key = fingerprint(target)
        self.memory = store.load(target.name, key) if store else TunerMemory(key)
        current = self._setting()
        self.controller = TuningController(
            lengths=sorted({*self._lengths(), current} - {OFF}), current=current,
            min_gain=target.tuning.min_gain,
            min_steps=target.tuning.min_steps,
            fills_length=target.speculation.method != "ngram")
        self.controller.restore(self.memory.learnt)
        if self.memory.calibration:
            self.controller.calibrated(_costs(self.memory.calibration),
                                       bool(self.memory.calibration.get("shaped", True)))
        self.retunes = 0
        # Whether a restart costs no service (its owner starts the new server beside the
        # old one: handover.may_go_beside), and the seconds its last start took to become
        # ready (what a restart in place costs).
        self.restart_is_free = restart_is_free
        self.restart_seconds: float | None = None
        # The old server of a handover still computes on these cores: no evidence meanwhile.
        self.sharing_cores = False
        self.features: frozenset[str] = frozenset()  # the runtime build's (preflight)
        self.last: Decision | None = None  # the latest decision, a "keep" too
        self._pending: Decision | None = None
        self._pending_since = 0.0
        self._pending_sent = False
        self._unbooked = False  # a decision applied whose restart has not been timed yet
        self._unsaved = 0
        self._cold_tokens = 0  # tokens a learning drafter still serves unjudged
        self._uncalibrated: str | None = None  # why no calibration can run
        self._interim = False  # the calibration's plain step is in, its drafted steps not
        self._carry: Delta | None = None  # counted since the busy seconds last moved
        self._carry_classes: dict[str, float] = {}
        self._checked = 0  # the controller's prediction checks already said in an event

    @property
    def active(self) -> bool:
        return self.target.tuning.enabled and self.target.speculation.method != "none"

    @property
    def speculation_on(self) -> bool:
        return self.controller.current != OFF if self.active else True

    @property
    def draft_length(self) -> int | None:
        """The length passed to the runtime: tuned, else configured, else its own default."""
        if not self.active or self.memory.setting is None:
            return self.target.speculation.length.start  # None: the runtime's own default
        return self.controller.current or self.target.speculation.length.start

    @property
    def variant(self) -> str | None:
        return self.target.speculation.variant

    def launch_backend(self, base: Backend | None = None) -> Backend:
        return (base or self.backend).with_variant(self.variant)

    def _setting(self) -> int:
        kept = self.memory.setting
        length = self.target.speculation.length
        high = length.max or self.backend.length_ceiling()
        if kept is not None and (kept == OFF or length.min <= kept <= high):
            return kept
        # Nothing kept, or a length the fleet file's bounds no longer allow: the start.
        return self.target.speculation.length.start or self.backend.default_length() or 1

    def _lengths(self) -> list[int]:
        length = self.target.speculation.length
        high = length.max or self.backend.length_ceiling()
        if self.target.speculation.method != "ngram":
            return list(range(max(1, length.min), high + 1))
        # n-gram lengths are caps on a match; powers of two are fine enough a grid (with the
        # configured start, so that what runs is always predicted too).
        out, k = {max(1, length.min), high, *([length.start] if length.start else [])}, 1
        while k <= high:
            if k >= length.min:
                out.add(k)
            k *= 2
        return sorted(out)

    @property
    def needs_calibration(self) -> bool:
        """Whether the owner should calibrate before the first decision (until it said it
        cannot, for this daemon's life)."""
        return self.active and self.memory.calibration is None and self._uncalibrated is None

    @property
    def may_decide(self) -> bool:
        """Whether a decision can rest on a measured cost: the calibration's plain step is
        in (then only off: `needs_calibration`), or no calibration is awaited."""
        return self._interim or not self.needs_calibration

    @property
    def serving_shows_plain_steps(self) -> bool:
        """Whether the served counters hold plain steps beside drafted ones: an n-gram
        drafter drafts only where the text matches, so the steps that matched nothing are
        plain (a draft model drafts on every step)."""
        return not self.controller.fills_length

    def uncalibrated(self, why: str) -> None:
        """No calibration can run (no room beside the server), or none is worth waiting
        for: decide without one."""
        self._uncalibrated = why
        self.emit("tuning", why)

    def plain_calibrated(self, result: Mapping[str, Any]) -> None:
        """The calibration's plain step, measured before its drafted steps: enough to see
        that what serves now loses to off (the served intervals say what the running
        setting costs), so until the rest is in, the only decision is off."""
        costs = _costs(result)
        self.controller.calibrated(costs, shaped=False)
        # Off-only until the lengths are in, unless it already decides from serving (the
        # calibration took too long): then the plain step only sharpens what it knows.
        self._interim = self._uncalibrated is None
        ms = round(costs[min(costs)].plain * 1e3, 1)
        self.emit("tuning", f"calibrating: a plain step {ms} ms; " + (
            "until the drafted steps are measured the only decision is speculation off, if "
            "the running setting loses to it" if self._interim else
            "decisions go on from serving until the drafted steps are measured"))

    def calibrated(self, result: Mapping[str, Any]) -> None:
        """A calibration's result (supervision/calibration.Calibration.to_dict)."""
        costs = _costs(result)
        self.controller.calibrated(costs, bool(result.get("shaped", True)))
        cost = costs[min(costs)]
        self._remember(replace(self.memory, calibration={**result, "time": round(time.time())}))
        ms = [round(x * 1e3, 1) for x in (cost.plain, cost.step, cost.per_draft)]
        self.emit("tuning", f"calibrated: a plain step {ms[0]} ms" + (
            f", a drafted step {ms[1]} ms + {ms[2]} ms a drafted token"
            if result.get("shaped", True) else " (drafted steps: learnt from serving)"),
            calibration=result)

    def _remember(self, memory: TunerMemory) -> None:
        self.memory = memory
        if self.store is not None:
            self.store.save(self.target.name, memory)

    def _learnt(self) -> None:
        self._remember(replace(self.memory, learnt=self.controller.state()))
        self._unsaved = 0

    def runtime_started(self, info: RuntimeInfo) -> None:
        """A server (re)started: the files and build a step's cost belongs to."""
        self.by_load.restarted()
        self._carry, self._carry_classes = None, {}  # the old server's counts
        self.features = info.features
        # A drafter that learns across requests starts empty: until it has served
        # min_tokens, it accepts less than the setting will once warm.
        self._cold_tokens = self.target.tuning.min_tokens if self.active and \
            self.speculation_on and self.launch_backend().drafter_learns() else 0
        if not self.active or self.memory.runtime_key == (key := runtime_key(self.target, info)):
            return
        if self.memory.runtime_key is not None:
            self.emit("tuning", "model file or runtime changed: the cost of a step will be "
                      "measured again", old_key=self.memory.runtime_key, new_key=key)
        self.controller.forget_costs()
        self._interim = False  # a plain step measured for the old files says nothing now
        self._remember(replace(self.memory, runtime_key=key, calibration=None,
                               learnt=self.controller.state()))

    def observe(self, sample: MetricsSample, proxy_peak: int = 0,
                proxy_busy: Mapping[int, float] | None = None,
                proxy_classes: Mapping[str, float] | None = None) -> str | None:
        """Add a metrics sample (`proxy_peak`: the most requests the proxy had in flight to
        this target since the previous sample; `proxy_busy`: the seconds it had 1, 2, ...
        in flight meanwhile; `proxy_classes`: the tokens each class of request made
        meanwhile); returns the reason for a restart when one is due now."""
        now = time.time()
        delta = self.window.observe(sample, now)
        self.by_load.read(now, sample.requests_processing, delta, proxy_peak, proxy_busy or {})
        if not self.active or self.sharing_cores or delta is None:
            if self.sharing_cores:
                self._carry, self._carry_classes = None, {}
            return self._due(sample)
        if self._cold_tokens > 0:
            self._cold_tokens -= delta.tokens
            self.window.clear()
            self.by_load.clear()
            return self._due(sample)
        # One interval of evidence ends where the busy seconds moved: runtimes add a
        # request's seconds when it ends (vLLM's decode time, llama.cpp's per-request
        # clock) while its tokens and drafts count as they come; split elsewhere, one
        # interval held drafts without their tokens and the next tokens without drafts.
        delta = merged(self._carry, delta)
        for c, n in (proxy_classes or {}).items():
            if n > 0:
                self._carry_classes[c] = self._carry_classes.get(c, 0.0) + float(n)
        if delta.seconds <= 0 or delta.tokens <= 0:
            self._carry = delta
            return self._due(sample)
        classes = self._carry_classes or {UNCLASSIFIED: float(delta.tokens)}
        self._carry, self._carry_classes = None, {}
        setting = self.controller.current
        self.controller.observe(Observation(
            Interval(delta.seconds, delta.tokens, delta.drafts, delta.draft_tokens,
                     delta.accepted, speculating=setting != OFF),
            setting, max(1, proxy_peak, sample.requests_processing), delta.per_position,
            classes))
        self._unsaved += 1
        if self._unsaved >= SAVE_EVERY:
            self._learnt()
        for check in self.controller.checks[self._checked:]:
            # How far off the last decision's prediction was, once the new setting had
            # served long enough to tell.
            self.emit("tuning", f"prediction checked: {describe(check['setting'])} predicted "
                      f"{check['predicted']:.2f}x this mix, measured {check['measured']:.2f}x",
                      check=check)
        self._checked = len(self.controller.checks)
        if self._pending is None and self.may_decide:
            decision = self.controller.decide(self.switch_cost(),
                                              only_off=self.needs_calibration)
            if decision is not None:
                first, self.last = self.last is None, decision
                if decision.action != KEEP:
                    self._pending, self._pending_since = decision, self.clock()
                elif first:  # an operator sees that tuning has begun, and on what
                    self.emit("tuning", f"first decision: {decision.reason}", **{
                        **decision.data, "action": KEEP, "setting": describe(decision.setting)})
        return self._due(sample)

    def arriving(self, cls: str, load: int) -> str | None:
        """A request of class `cls` is about to be relayed, `load` requests in flight with
        it: the reason to restart first, where the mix does not hold its class and it is
        known to lose at every setting (off) or never seen (the shortest length, once the
        drafted steps' cost is calibrated: controller.arriving); the decision is then this
        restart's (`apply_pending`), and the caller holds the request until the server
        that serves it runs the new setting."""
        if not self.active or self._pending is not None or self.sharing_cores or \
                not self.may_decide:
            return None
        decision = self.controller.arriving(cls, load, self.switch_cost(),
                                            only_off=self.needs_calibration)
        if decision is None:
            return None
        reason = f"a request of class {cls!r} arrives: {decision.reason}"
        self.last = decision = replace(decision, reason=reason)
        self._pending, self._pending_since, self._pending_sent = decision, self.clock(), True
        return reason

    def _due(self, sample: MetricsSample) -> str | None:
        """The pending decision's reason once it may restart the server: idle, beside, or
        after waiting `max_wait`."""
        if self._pending is None or self._pending_sent:
            return None
        waited = self.clock() - self._pending_since
        if sample.requests_processing == 0 or self.restart_is_free or \
                waited >= self.target.tuning.max_wait:
            self._pending_sent = True
            return self._pending.reason
        return None

    def switch_cost(self) -> float:
        """Busy seconds a restart costs: its time to ready in place, a share of it beside."""
        ready = self.restart_seconds if self.restart_seconds is not None else ASSUMED_RESTART_S
        return ready * BESIDE_SHARE if self.restart_is_free else ready

    def waiting_for(self) -> str | None:
        if self._pending is None or self._pending_sent:
            return None
        return (f"an idle server (at most {self.target.tuning.max_wait:.0f} s): the restart "
                "would interrupt the requests running")

    def share_cores(self, sharing: bool) -> None:
        """Whether the old server of a handover still computes on this one's cores: what is
        measured meanwhile is no evidence (handover.py)."""
        self.sharing_cores = sharing

    def restarted(self, seconds: float, beside: bool) -> None:
        """Ready `seconds` after its start (`beside` the old server): a switch's cost."""
        self.restart_seconds = seconds
        if self._unbooked:
            self._unbooked = False
            self._remember(evidence.booked(self.memory, seconds, beside))

    def apply_pending(self) -> None:
        """Make the pending decision the current setting (the caller restarts the server)."""
        decision = self._pending
        if decision is None:
            return
        old = self.controller.current
        self.controller.switched(decision)
        self.retunes += 1
        data = {**decision.data, "action": decision.action, "old": describe(old),
                "new": describe(decision.setting), "expected_gain": round(
                    decision.expected_gain, 3), "speculation": decision.setting != OFF,
                "waited_s": round(self.clock() - self._pending_since, 1)}
        memory = replace(self.memory, setting=decision.setting, learnt=self.controller.state())
        self._remember(evidence.logged(memory, decision.reason, data, time.time()))
        self._unbooked = True  # the restart that follows is this decision's cost
        self.emit("tuning", decision.reason, **data)
        self.window.clear()
        self.by_load.clear()
        self._pending, self._pending_sent = None, False

    def view(self, stats: WindowStats | None = None) -> dict[str, Any]:
        """The tuner's state for status and the API; `stats`: the window's, if the caller
        has computed them already."""
        if not self.active:
            return {"enabled": False}
        preds = self.controller.predictions()
        cost = self.controller.cost("1")
        return {"enabled": True, "setting": describe(self.controller.current),
                "tuned_length": self.memory.setting or None,
                "calibration": self.memory.calibration,
                "needs_calibration": self.needs_calibration,
                "cost": cost.to_dict() if cost else None,
                "classes": {c: a.view() for c, a in self.controller.classes.items()},
                "mix": self.controller.rounded_shares(),
                "predicted": {describe(k): p.to_dict() for k, p in (preds or {}).items()},
                "remaining_busy_s": round(self.controller.remaining(), 1),
                "window": (stats or self.window.stats()).to_dict(),
                "warming_tokens_left": max(0, self._cold_tokens),
                "pending": self._pending.reason if self._pending else None,
                "waiting_for": self.waiting_for(),
                "last_decision": self.memory.decisions[-1] if self.memory.decisions else None,
                "checks": self.controller.checks[-5:]}


def _costs(calibration: Mapping[str, Any]) -> dict[str, StepCost]:
    """A calibration's costs by load bucket."""
    return {b: StepCost.from_dict(c) for b, c in (calibration.get("costs") or {}).items()}
