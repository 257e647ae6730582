"""AutoTuner: one target's tuning state, between its metrics and its restarts.

It owns the acceptance window, the drift detectors and the tuner memory of one target.
The owner feeds it every metrics sample (`observe`, which may return the reason for a
restart), calls `apply_pending` just before that restart (the decision goes into the log
evidence.py shows) and `restarted` once the new server is ready. A "keep" decision records
a measurement and restarts nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from supervisor.config.schema import Target
from supervisor.plugin.backend import LENGTHS_BY_LOAD, Backend, MetricsSample, RuntimeInfo
from supervisor.tuning import evidence
from supervisor.tuning.by_load import judge_table, tabulate
from supervisor.tuning.decisions import Action, Bounds, Decision, contradicted, plan
from supervisor.tuning.drift import PageHinkley, either_drifted
from supervisor.tuning.holding import Hold, hold, weigh
from supervisor.tuning.load import LoadWindows
from supervisor.tuning.mix import batch_ranges, summary
from supervisor.tuning.numbers import rounded
from supervisor.tuning.regime_book import RegimeBook
from supervisor.tuning.regimes import setting_key
from supervisor.tuning.sampling import SamplingWatch
from supervisor.tuning.store import SPECULATING, TunerMemory, TuningStore, fingerprint, runtime_key
from supervisor.tuning.variants import allowed_variants, search
from supervisor.tuning.window import AcceptanceWindow, Delta, WindowStats

EventSink = Callable[..., None]  # (kind, reason, **data)
# Decisions that judged the window at the setting in effect (its acceptance describes it).
EVALUATIONS = frozenset({Action.KEEP, Action.RETUNE, Action.EXPLORE, Action.DISABLE,
                         Action.VARIANT})


class AutoTuner(RegimeBook):
    def __init__(self, target: Target, backend: Backend, store: TuningStore | None,
                 emit: EventSink, clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self.backend = backend
        self.store = store
        self.emit = emit
        self.clock = clock
        self.window = AcceptanceWindow(max_steps=target.tuning.window_steps)
        self.by_load = LoadWindows(max_steps=target.tuning.window_steps)
        self.drift = PageHinkley(threshold=target.tuning.drift_threshold)
        # A workload where n-gram methods find no match drafts on few steps: its acceptance
        # may hardly move (few drafts, judged as before), its throughput falls to "off".
        self.drafting_drift = PageHinkley(threshold=target.tuning.drift_threshold)
        self.sampling = SamplingWatch()  # the requests' temperature (tuning/sampling.py)
        self.variants_allowed = allowed_variants(
            target.speculation.variants, target.speculation.variant, backend.ngram_variants())
        key = fingerprint(target)
        self.memory = store.load(target.name, key) if store else TunerMemory(key)
        self.retunes = 0
        # Set by the owner: whether a restart now costs no service (a handover), and the
        # seconds its last start took to become ready (what a restart in place costs).
        self.restart_is_free: Callable[[], bool] = lambda: False
        self.restart_seconds: float | None = None
        # The old server of a handover still computes on these cores: no evidence meanwhile.
        self.sharing_cores = False
        self._unbooked = False  # a decision applied whose restart has not been timed yet
        self._workload_since: float | None = None  # the first sample, or the last drift
        self.features: frozenset[str] = frozenset()  # the runtime build's (preflight)
        self._drifted = False
        # Acceptance judged at each setting since the last drift: the regime it leaves
        # (not while a change is building: those windows hold some of the next regime).
        self._seen: dict[str, float] = {}
        # The last regime left at a drift of the tokens: when (its `seen`) and after how many
        # of the sampling watch's requests, to tell whether a later change of the sampling
        # is the same change seen late.
        self._left: tuple[float, int] | None = None
        self._pending: Decision | None = None
        self._pending_since = 0.0
        self._pending_sent = False
        self._cold_tokens = 0  # tokens a learning drafter still serves unjudged

    @property
    def active(self) -> bool:
        return self.target.tuning.enabled and self.target.speculation.method != "none"

    @property
    def speculation_on(self) -> bool:
        return self.memory.speculation if self.active else True

    @property
    def draft_length(self) -> int | None:
        """The length passed to the runtime: tuned, else configured, else its own default.
        `length.start` is the configured variant's: another variant starts at the runtime's
        default for it (mod's n-max and simple's size-m differ: 64 and 48 in llama.cpp)."""
        tuned = self.memory.length if self.active else None
        if tuned is not None:
            return tuned
        if self.variant != self.target.speculation.variant:
            return None
        return self.target.speculation.length.start

    @property
    def variant(self) -> str | None:
        """The n-gram variant it runs: tuned (speculation.variants), else configured."""
        # A variant tuned before the fleet file narrowed `variants` is not run.
        tuned = self.memory.variant if self.active and \
            self.memory.variant in self.variants_allowed else None
        return tuned or self.target.speculation.variant

    @property
    def lengths_by_load(self) -> dict[str, int]:
        """The table of lengths by load it runs ({}: one length), where the runtime takes one."""
        if not (self.active and self.speculation_on and LENGTHS_BY_LOAD in self.features):
            return {}
        return self.memory.lengths_by_load

    def launch_backend(self, base: Backend | None = None) -> Backend:
        """The backend for the variant and lengths by load it runs (configured, when not
        tuned); `base`: the backend on the port it is to listen on."""
        backend = (base or self.backend).with_variant(self.variant)
        table = self.lengths_by_load
        return backend.with_lengths_by_load(batch_ranges(table)) if table else backend

    def bounds(self) -> Bounds:
        length = self.target.speculation.length
        backend = self.launch_backend()
        current = self.draft_length or backend.default_length() or 1
        return Bounds(current, length.min, length.max or backend.length_ceiling(),
                      backend.tunable_length() is not None)

    def _remember(self, memory: TunerMemory) -> None:
        self.memory = memory
        if self.store is not None:
            self.store.save(self.target.name, memory)

    def runtime_started(self, info: RuntimeInfo) -> None:
        """A server (re)started: which model and runtime the baseline is of; a cold drafter?"""
        self.by_load.last_read = None  # the time it was down is no load
        self.features = info.features
        if self.active:
            self._check_runtime(info)
        # A drafter that learns across requests starts empty: until it has served min_tokens,
        # its numbers describe a cold server, not the setting (tuner_phases run 10: ngram-mod
        # at n-max 25 measured 2.39x just restarted, n-max 16 2.64x on a server up for minutes).
        self._cold_tokens = (self.target.tuning.min_tokens if self.active
                             and self.speculation_on and self.launch_backend().drafter_learns()
                             else 0)

    def _check_runtime(self, info: RuntimeInfo) -> None:
        if self.memory.baseline_key == (key := runtime_key(self.target, info)):
            return
        if self.memory.baseline_tps is not None:
            self.emit("tuning", "model file or runtime changed: the baseline will be "
                      "measured again", old_key=self.memory.baseline_key, new_key=key)
        # Measure again from scratch: whatever was concluded against the old baseline is void.
        self._remember(replace(self.memory, phase=SPECULATING, baseline_tps=None,
                               baseline_by_load={}, baseline_key=key, measured={},
                               cost_split=None))

    def observe(self, sample: MetricsSample, proxy_peak: int = 0,
                proxy_busy: Mapping[int, float] | None = None,
                proxy_sampling: tuple[int, int] = (0, 0)) -> str | None:
        """Add a metrics sample (`proxy_peak`: the most requests the proxy had in flight to
        this target since the previous sample; `proxy_busy`: the seconds it had 1, 2, ...
        in flight meanwhile, by number; `proxy_sampling`: the greedy and the sampled
        requests it started meanwhile); returns the reason for a restart when one is due
        now."""
        now = time.time()
        if self._workload_since is None:
            self._workload_since = now
        delta = self.window.observe(sample, now)
        self.by_load.read(now, sample.requests_processing, delta, proxy_peak, proxy_busy or {})
        if self.sharing_cores:
            self._warm_up(None)  # dropped as a cold drafter's first tokens are
        if not self.active or self.sharing_cores:
            return None
        sampled = self.sampling.observe(*proxy_sampling)
        if self._cold_tokens > 0:
            self._warm_up(delta)
        elif (delta is not None and self.speculation_on and not sampled
              and (drifted := either_drifted(self.drift, self.drafting_drift,
                                             delta.acceptance_rate, delta.draft_fraction))):
            self._workload_changed(now, *drifted, None, acceptance_rate=rounded(
                delta.acceptance_rate), draft_fraction=rounded(delta.draft_fraction))
        # Seen in the requests themselves, with speculation on or off (unless the tokens
        # showed it first: then the regime was left at that drift).
        if sampled and not self._seen_first_in_tokens(sampled):
            self._workload_changed(now, "the share of greedy requests", sampled,
                                   self.sampling.left_share, **self.sampling.view())
            self._left = None  # left at this change: the next one is another
            # Sampled more, a draft that did not pay will not start to (run 15 re-probed at
            # once in prose, at 0.36x): while off, only a recalled workload ends it early.
            if not self._recall_sampled() and sampled == "down" and not self.speculation_on:
                self._drifted = False
        if self._pending is None and self._cold_tokens <= 0:
            decision = self._decide(now)
            if decision is not None and decision.action == Action.KEEP:
                self._remember(decision.memory)  # a measurement, no restart
            elif decision is not None:
                self._pending, self._pending_since = decision, self.clock()
        if self._pending is not None and not self._pending_sent:
            waited = self.clock() - self._pending_since
            if sample.requests_processing == 0 or waited >= self.holding().seconds:
                self._pending_sent = True
                return self._pending.reason
        return None

    def restarted(self, seconds: float, beside: bool) -> None:
        """Ready `seconds` after its start (`beside` the old server): a switch's cost."""
        self.restart_seconds = seconds
        if self._unbooked:
            self._unbooked = False
            self._remember(evidence.booked(self.memory, seconds, beside))

    def holding(self) -> Hold:
        """How long the pending decision waits for an idle server (tuning/holding.py)."""
        gain = self._pending.data.get("predicted_gain") if self._pending else None
        settings = self.target.tuning
        return hold(settings.max_wait, self.restart_seconds,
                    gain if isinstance(gain, int | float) else None, settings.min_gain,
                    self.restart_is_free())

    def _workload_changed(self, now: float, what: str, direction: str, left_share: float | None,
                          **data: Any) -> None:
        self._drifted = True
        self.emit("tuning", f"{what} drifted {direction} (Page-Hinkley): re-evaluating on new "
                  "evidence", direction=direction, drifted=what,
                  window=self.window.stats().to_dict(), **data)
        self._fresh_evidence()
        self._leave_regime(now, left_share)

    def _fresh_evidence(self) -> None:
        """After a change of setting or of workload: the windows and detectors start over."""
        self.window.clear()
        self.by_load.clear()
        self.drift.reset()
        self.drafting_drift.reset()

    def _warm_up(self, delta: Delta | None) -> None:
        """A learning drafter's first tokens after a start (its acceptance rises as it
        learns), or a new server's beside the old one: dropped, not watched for drift."""
        if delta is not None:
            self._cold_tokens -= delta.tokens
        self.window.clear()
        self.by_load.clear()

    def _decide(self, now: float) -> Decision | None:
        settings, stats = self.target.tuning, self.window.stats()
        load = summary(self.by_load.stats(), settings.min_tokens)
        if self.lengths_by_load and self.memory.phase == SPECULATING:
            return judge_table(self.memory, stats.drafts, settings, now, self._drifted, load)
        bounds = self.bounds()
        said = contradicted(self.memory, stats, load, settings.min_steps, bounds.current,
                            self._seen.get(setting_key(self.variant, bounds.current)))
        if said is not None and not self._drifted:  # a drift the throughput shows first
            self.emit("tuning", said, drifted="throughput", window=stats.to_dict())
            self._drifted = True
            self._leave_regime(now)
        if self._drifted and stats.drafts >= settings.min_steps:
            self._recall_regime(setting_key(self.variant, bounds.current), stats)
        decision = plan(self.memory, stats, settings, bounds, now, self._drifted, load)
        decision = search(decision, self.variant or "", self.variants_allowed, settings, now)
        if (decision is not None and decision.action in EVALUATIONS and stats.acceptance_rate
                and not (self.drift.building() or self.drafting_drift.building())):
            self._seen[setting_key(self.variant, bounds.current)] = stats.acceptance_rate
        decision = tabulate(decision, LENGTHS_BY_LOAD in self.features, settings, now)
        return self._weigh(decision, stats, now)

    def _weigh(self, decision: Decision | None, stats: WindowStats, now: float) -> Decision | None:
        """A new length must pay back its switch (tuning/holding.py)."""
        tps = stats.tokens_per_second or 0.0
        warm = (self.target.tuning.min_tokens / tps
                if tps and self.launch_backend().drafter_learns() else 0.0)
        # The new setting runs at least `cooldown` (no change comes sooner but at a drift),
        # so the workload is expected to last at least that long.
        lasted = max(now - (self._workload_since or now), self.target.tuning.cooldown)
        return weigh(decision, self.memory, self.bounds().current, self.restart_seconds,
                     self.restart_is_free(), warm, lasted)

    def apply_pending(self) -> None:
        """Make the pending decision the current setting (the caller restarts the server)."""
        decision = self._pending
        if decision is None:
            return
        old = self.bounds().current
        self._remember(decision.memory)
        self.retunes += 1
        data = {**decision.data, "action": decision.action, "old_length": old,
                "new_length": self.draft_length, "speculation": self.speculation_on,
                "variant": self.variant, "waited_s": round(self.clock() - self._pending_since, 1)}
        self._remember(evidence.logged(self.memory, decision.reason, data, time.time()))
        self._unbooked = True  # the restart that follows is this decision's cost
        self.emit("tuning", decision.reason, **data)
        self._fresh_evidence()
        self._drifted, self._pending, self._pending_sent = False, None, False

    def view(self, stats: WindowStats | None = None) -> dict[str, Any]:
        """The tuner's state for status and the API; `stats`: the window's, if the caller
        has computed them already."""
        if not self.active:
            return {"enabled": False}
        m = self.memory
        return {"enabled": True, "phase": m.phase, "tuned_length": m.length,
                "variant": self.variant, "variants_measured": m.variants,
                "regimes_kept": len(m.regimes),
                "lengths_by_load": self.lengths_by_load,
                "baseline_tps": None if m.baseline_tps is None else round(m.baseline_tps, 2),
                "baseline_by_load": {b: round(t, 2) for b, t in m.baseline_by_load.items()},
                "window": (stats or self.window.stats()).to_dict(),
                "warming_tokens_left": max(0, self._cold_tokens),
                "pending": self._pending.reason if self._pending else None,
                "waiting_for": self.holding().why if self._pending and not self._pending_sent
                else None,
                "last_decision": m.last_decision}
