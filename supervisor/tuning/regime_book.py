"""The tuner's book of workload regimes: leaving one at a drift, recalling a kept one.

A mixin of AutoTuner (tuning/autotuner.py), apart so that each file keeps one job: the
regimes' pure rules are in tuning/regimes.py, this is their use by one target's tuner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from supervisor.tuning.regimes import recall, recall_sampled, relabel, remember
from supervisor.tuning.sampling import SamplingWatch
from supervisor.tuning.store import TunerMemory
from supervisor.tuning.window import WindowStats


class RegimeBook:
    """What AutoTuner provides: its memory, events, sampling watch and running variant."""

    memory: TunerMemory
    emit: Callable[..., None]
    sampling: SamplingWatch
    _seen: dict[str, float]
    _left: tuple[float, int] | None
    _workload_since: float | None

    @property
    def variant(self) -> str | None:
        raise NotImplementedError

    def _remember(self, memory: TunerMemory) -> None:
        raise NotImplementedError

    def _seen_first_in_tokens(self, direction: str) -> bool:
        """At a change of the sampling: whether a drift of acceptance or throughput already
        left a regime for it, after the new workload's first request. The tokens often show
        a change before the sampling does (with a request a minute, five requests are five
        minutes), and what was measured since that drift is the new workload's: leaving a
        regime again would book it to the old one's share of greedy requests, and a return
        would recall it as the old workload's (run 18 of tuner_phases: prose's 0.19x at 11
        and 0.52x at 2 came back as code's, and code was served off). So the regime left at
        that drift gets the old share, and the measurements stay (where there are none, a
        kept regime with the new share comes back, as at any change of sampling)."""
        onset = self.sampling.onset
        if self._left is None or onset is None or self._left[1] < onset:
            return False
        seen, _ = self._left
        self._left = None
        m, share = self.memory, self.sampling.left_share
        self.emit("tuning", f"the share of greedy requests drifted {direction} (Page-Hinkley):"
                  " a change the tokens showed first, measured since as the new workload",
                  direction=direction, drifted="the share of greedy requests",
                  **self.sampling.view())
        self._remember(replace(m, regimes=relabel(m.regimes, seen, share)))
        self._recall_sampled()  # where nothing was measured since: a workload seen before
        return True

    def _leave_regime(self, now: float, greedy_share: float | None = None) -> None:
        """At a drift: the speedups measured before it describe a workload that is gone;
        they are kept with the acceptance last judged and the share of greedy requests
        (`greedy_share`, else the current one), for its return (tuning/regimes.py)."""
        self._workload_since = now  # a new workload starts
        m = self.memory
        share = greedy_share if greedy_share is not None else self.sampling.share
        regimes = remember(m.regimes, self._seen, self.variant, m.measured, m.variants, now,
                           share)
        self._left = (now, self.sampling.count)  # (none is kept where nothing was measured)
        self._seen = {}
        self._remember(replace(m, measured={}, variants={}, regimes=regimes))

    def _recall_regime(self, setting: str, stats: WindowStats) -> None:
        """After a drift, once there is evidence: a kept regime with this acceptance here."""
        m = self.memory
        if m.measured or m.variants or stats.acceptance_rate is None:
            return
        if (regime := recall(m.regimes, setting, stats.acceptance_rate)) is not None:
            self._resume(regime, f"acceptance {stats.acceptance_rate:.2f} at {setting} matches"
                         f" a workload seen before ({regime['acceptance'][setting]:.2f})",
                         setting=setting, acceptance_rate=round(stats.acceptance_rate, 4),
                         regime_acceptance=regime["acceptance"][setting])

    def _recall_sampled(self) -> bool:
        """At a change of the requests' sampling: a kept regime with the new share of greedy
        requests, at once (speculation may be off); whether one came back."""
        share, m = self.sampling.share, self.memory
        regime = (None if share is None or m.measured or m.variants
                  else recall_sampled(m.regimes, share))
        return regime is not None and self._resume(
            regime, f"{share:.0%} of the latest requests greedy, as in a workload seen before "
            f"({regime['greedy_share']:.0%})", **self.sampling.view())

    def _resume(self, regime: Mapping[str, Any], said: str, **data: Any) -> bool:
        # Speedups by length are the variant's that ran when the regime was left.
        measured = dict(regime["measured"]) if regime.get("variant") == self.variant else {}
        variants = dict(regime["variants"])
        if not (measured or variants):
            return False
        self._remember(replace(self.memory, measured=measured, variants=variants))
        self.emit("tuning", f"{said}: resuming from what was measured in it", action="recall",
                  measured={k: round(v["speedup"], 3) for k, v in measured.items()},
                  variants=variants, **data)
        return True
