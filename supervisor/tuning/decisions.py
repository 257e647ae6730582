"""When to retune: the decision layer between measured acceptance and a restart.

A retune costs a restart, so the plan is conservative (defaults in docs/tuning.md):
- no decision without evidence: `min_steps` verification steps at the current setting;
- a baseline (throughput without speculation) is measured, not assumed: once the
  target has served `min_tokens` tokens, it runs without speculation until it has
  served `min_tokens` more, then speculation comes back; the baseline is kept per
  model file and runtime build (and per load) and measured again when either changes, or
  at the loads it lacks when those hold most of the window's tokens;
- a new length only when its predicted gain over the current one is >= `min_gain`;
- after a change, `cooldown` before the next one, unless the drift detector saw a
  sustained change of acceptance (then as soon as there is new evidence);
- speculation off when no length beats it by `off_margin`, and a re-probe with
  speculation after `reprobe`, at a short draft (`probe_length`);
- a setting measured at under `LOSING` times the baseline is judged at once, on a quarter
  of `min_steps`, cool-down or not: the cool-down keeps marginal changes from flapping, it
  must not hold a setting that loses most of the throughput;
- lengths already measured in the current workload regime are judged by their
  measured speedup; when only one length has been measured and the model prefers
  another by less than `min_gain` but at least half of it, that one is tried once
  ("explore"), so that the cost model is fitted on two points instead of assumed. A drift
  clears the measurements: the workload they describe is gone;
- where there is evidence by load (the server's throughput per concurrency bucket, with
  the baseline's per bucket), a length is judged by its speedup over the observed mix of
  loads (tuning/mix.py), not by the ratio of per-request speeds, which mixes loads:
  a request is slower when seven others share the server, whatever the setting.
`plan` is a pure function of the memory, the window, the load summary and the clock.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from supervisor.config.schema import Tuning
from supervisor.tuning.actions import Action, Bounds, Decision
from supervisor.tuning.mix import MixJudgement, Summary, judge, over_mix
from supervisor.tuning.numbers import rounded
from supervisor.tuning.refresh import refreshed
from supervisor.tuning.speedup import Choice, Evidence, Measurement, choose, measurement, split_of
from supervisor.tuning.store import BASELINE, OFF, SPECULATING, TunerMemory
from supervisor.tuning.window import WindowStats

# Lengths tried per workload regime before the search stops at the best one measured.
SEARCH_LIMIT = 3
# A re-probe that finds speculation still does not pay doubles the wait before the next,
# up to 2**REPROBE_DOUBLINGS times `reprobe`: a target whose speculation never pays (a
# self-draft, a prose-only workload) stops paying a restart and a slow window every hour.
REPROBE_DOUBLINGS = 3
# A re-probe drafts this many tokens a step (or the shortest length allowed, if longer):
# where speculation still does not pay, a short draft loses least while it is measured
# (run 13 of tuner_phases, prose: n-max 2 at 0.57x off, 12 at 0.17x), and where it pays
# again its acceptance shows it and a retune lengthens the draft from there.
PROBE_LENGTH = 2
# Under this speedup over the baseline a setting is judged without waiting for the
# cool-down, and on a quarter of the usual evidence: run 13 of tuner_phases held n-max 12 at
# 0.18x off in prose for a whole cool-down after the retune to it. Nothing this slow is
# noise: at 0.6x a quarter of `min_steps` is still tens of verification steps.
LOSING = 0.6
# A window at a length this workload already measured, reading under FELL of that
# measurement while its acceptance is more than ACCEPTANCE_FELL under the acceptance judged
# at the same setting, is a new workload, not a new measurement of the old one: a window
# that straddles a change of workload read 16 at 0.65x (run 18 of tuner_phases) and 0.80x
# (run 16) where code had measured 1.18x and 1.08x, and the old regime kept the low number
# in place of its own. Either drop alone can be noise (throughput on a shared box; the
# acceptance of a short window): both at once are not.
FELL = 0.75
ACCEPTANCE_FELL = 0.16


def plan(memory: TunerMemory, stats: WindowStats, settings: Tuning, bounds: Bounds,
         now: float, drift: bool, load: Summary | None = None) -> Decision | None:
    """The next tuning action for a target, or None to keep the current setting.
    `load`: the window's evidence by load bucket (tuning/mix.summary), if any."""
    load = load or {}
    if memory.phase == BASELINE:
        done = stats.tokens >= settings.min_tokens and stats.tokens_per_second
        return _baseline_done(memory, stats, settings, bounds, now, load) if done else None
    if memory.phase == OFF:
        return _reprobe(memory, settings, bounds, now, drift, stats, load)
    if memory.baseline_tps is None:
        # Wait for enough speculative evidence too, so that it can be judged the moment the
        # baseline is known; a target that hardly ever drafts gets its baseline anyway.
        if stats.tokens < settings.min_tokens or (
                stats.drafts < settings.min_steps and stats.tokens < 4 * settings.min_tokens):
            return None
        return _measure_baseline(memory, stats, load, now, "no baseline for this model and "
                                 "runtime yet: measuring throughput without speculation for "
                                 f"{settings.min_tokens} tokens", {})
    if not stats.tokens_per_second or stats.drafts < max(1, settings.min_steps // 4):
        return None
    losing = quick_speedup(memory, stats, load) < LOSING
    if not losing and stats.drafts < settings.min_steps:
        return None
    if (not drift and not losing and memory.last_change is not None
            and now - memory.last_change < settings.cooldown):
        return None
    if load and memory.baseline_by_load and judge(load, memory.baseline_by_load) is None:
        # Most tokens ran at loads the baseline did not see: else judged by per-request
        # speeds against other loads' baseline (steady_load run 2: 0.33x, turned off where
        # it ran 1.4x at one client). At most once per cool-down, as any decision.
        lacking = [b for b in load if not memory.baseline_by_load.get(b)]
        return _measure_baseline(memory, stats, load, now, f"the baseline lacks the loads of "
                                 f"most tokens now ({', '.join(lacking)} running): measuring "
                                 "throughput without speculation there", {"lacking": lacking})
    return evaluate(memory, stats, settings, bounds, now, drift, load)


def _measure_baseline(memory: TunerMemory, stats: WindowStats, load: Summary, now: float,
                      reason: str, data: dict[str, Any]) -> Decision:
    """Speculation off for `min_tokens`; the window before it is judged once it is done."""
    before = {**asdict(stats), "load": {b: list(v) for b, v in load.items()}}
    memory = replace(memory, phase=BASELINE, last_change=now, before_baseline=before)
    return Decision(Action.BASELINE, memory, reason, {"evidence": stats.to_dict(), **data})


def probe_length(bounds: Bounds) -> int:
    """The draft length a re-probe runs: short (PROBE_LENGTH), within the bounds."""
    if not bounds.tunable:
        return bounds.current
    return max(bounds.low, min(PROBE_LENGTH, bounds.high))


def _reprobe(memory: TunerMemory, settings: Tuning, bounds: Bounds, now: float,
             drift: bool, stats: WindowStats, load: Summary) -> Decision | None:
    """Speculation back on after `reprobe_wait` off, at a short draft. At once where the
    workload changed while off (`drift`: the requests' sampling, tuning/sampling.py), and
    then at the best length measured in it if it is one seen before (its measurements were
    recalled): a re-probe doubled in prose must not leave the next code phase off. The
    tokens served off since the last change refresh the baseline (`refreshed`)."""
    wait = reprobe_wait(memory, settings)
    if not drift and memory.last_change is not None and now - memory.last_change < wait:
        return None
    memory, fresh = refreshed(memory, stats, load, settings.min_tokens)
    on = replace(memory, phase=SPECULATING, last_change=now,
                 disables=0 if drift else memory.disables)  # a new workload: no back-off
    paying = {int(k): float(m["speedup"]) for k, m in memory.measured.items()
              if float(m["speedup"]) >= 1.0 + settings.off_margin
              and (bounds.low <= int(k) <= bounds.high or not bounds.tunable)}
    if drift and paying:
        best = max(paying, key=lambda k: (paying[k], -k))
        length = best if bounds.tunable else memory.length
        return Decision(Action.ENABLE, replace(on, length=length),
                        f"the workload changed to one seen before: speculation back on at "
                        f"length {best}, measured at {paying[best]:.2f}x in it",
                        {"length": best, "recalled": True, **fresh})
    probe = probe_length(bounds)
    said = "now: the workload changed" if drift else f"after {wait:g}s off"
    return Decision(Action.ENABLE, replace(on, length=probe if bounds.tunable else memory.length),
                    f"re-probing speculation at length {probe} {said}",
                    {"length": probe, "waited_off_s": None if drift else wait, **fresh})


def quick_speedup(memory: TunerMemory, stats: WindowStats, load: Summary) -> float:
    """The window's speedup over the baseline over the mix of loads; the plain ratio of
    speeds only where there is no evidence by load at all. 1.0 (not known to lose) without
    a baseline, or where the window ran at loads the baseline did not see: a request is
    slower beside seven others whatever the setting, and that is no reason to hurry."""
    if not memory.baseline_tps or not stats.tokens_per_second:
        return 1.0
    if mix := judge(load, memory.baseline_by_load):
        return mix.speedup
    return 1.0 if load else stats.tokens_per_second / memory.baseline_tps


def contradicted(memory: TunerMemory, stats: WindowStats, load: Summary, min_steps: int,
                 current: int, seen: float | None = None) -> str | None:
    """Why the window says the workload changed before the drift detector does: the setting
    loses (under LOSING) where this regime measured speculation paying, or it fell at a
    length this regime measured paying, with the acceptance judged there (`seen`) fallen too
    (FELL, ACCEPTANCE_FELL). Those measurements
    describe another workload, and a choice made from them goes wrong (run 14 of
    tuner_phases, entering prose: n-max 13 at 0.17x, retuned to 11 predicted 1.14x from an
    11 measured on code)."""
    if memory.phase != SPECULATING or not memory.measured or stats.drafts < max(1, min_steps // 4):
        return None
    quick = quick_speedup(memory, stats, load)
    best = max(float(m["speedup"]) for m in memory.measured.values())
    if quick < LOSING and best >= 1.0:
        return (f"throughput fell to {quick:.2f}x the baseline at length {current}, where this "
                f"workload measured up to {best:.2f}x: taken as a change of workload")
    here, rate = memory.measured.get(str(current)), stats.acceptance_rate
    if here is None or seen is None or rate is None:
        return None
    before = float(here["speedup"])
    if before >= 1.0 and quick < FELL * before and seen - rate > ACCEPTANCE_FELL:
        return (f"length {current} reads {quick:.2f}x the baseline accepting {rate:.2f}, where "
                f"this workload measured {before:.2f}x accepting {seen:.2f}: taken as a change "
                "of workload")
    return None


def reprobe_wait(memory: TunerMemory, settings: Tuning) -> float:
    """Seconds off before the next re-probe: `reprobe`, doubled for each re-probe in a row
    that found speculation still not paying."""
    return settings.reprobe * 2 ** min(max(memory.disables - 1, 0), REPROBE_DOUBLINGS)


def _baseline_done(memory: TunerMemory, stats: WindowStats, settings: Tuning, bounds: Bounds,
                   now: float, load: Summary) -> Decision:
    tps = stats.tokens_per_second or 0.0
    raw_before = memory.before_baseline
    # Loads this run saw are measured anew; those it did not keep what was measured there.
    by_load = {**memory.baseline_by_load,
               **{b: throughput for b, (_, throughput) in load.items()}}
    memory = replace(memory, phase=SPECULATING, baseline_tps=memory.baseline_tps or tps,
                     last_change=now, before_baseline=None, baseline_by_load=by_load)
    said = f"baseline measured: {tps:.1f} tokens/s without speculation over {stats.tokens} tokens"
    data = {"baseline_tps": rounded(tps, 3), "baseline_evidence": stats.to_dict(),
            "baseline_by_load": {b: rounded(t, 2) for b, t in by_load.items()}}
    before = _usable_window(raw_before, settings)
    before_load = {b: (int(n), float(t))
                   for b, (n, t) in (raw_before or {}).get("load", {}).items()}
    if before is not None and before_load and judge(before_load, by_load) is None:
        # The baseline run met other loads than the window before it (the traffic changed
        # meanwhile): per-request speeds of 8 clients against one client's baseline are no
        # verdict (steady_load run 4: 0.46x, and the variant judged as not paying).
        lacking = ", ".join(b for b in before_load if not by_load.get(b))
        return Decision(Action.RESTORE, memory, f"{said}; speculation back on at length "
                        f"{bounds.current}, the window before it not judged: the baseline "
                        f"still lacks its loads ({lacking})",
                        {**data, "length": bounds.current, "lacking": lacking.split(", ")})
    if before is not None:
        verdict = evaluate(memory, before, settings, bounds, now, False, before_load)
        if verdict.action == Action.DISABLE:
            return Decision(Action.DISABLE, verdict.memory, f"{said}; {verdict.reason}",
                            {**verdict.data, **data})
        if verdict.action in (Action.RETUNE, Action.EXPLORE):
            return Decision(Action.RESTORE, verdict.memory, f"{said}; speculation back on: "
                            f"{verdict.reason}", {**verdict.data, **data})
        memory = verdict.memory  # keeps the measurement
    return Decision(Action.RESTORE, memory, f"{said}; speculation back on at length {bounds.current}",
                    {**data, "length": bounds.current})


def _usable_window(raw: dict[str, Any] | None, settings: Tuning) -> WindowStats | None:
    """The with-speculation window recorded before the baseline run, if it is evidence enough."""
    if raw is None:
        return None
    raw = {k: v for k, v in raw.items() if k != "load"}
    stats = WindowStats(**{**raw, "per_position_rate": tuple(raw.get("per_position_rate", ()))})
    return stats if stats.drafts >= settings.min_steps and stats.tokens_per_second else None


def _judged(choice: Choice, bounds: Bounds, memory: TunerMemory, split_here: bool,
            drift: bool, so_far: dict[int, Measurement], stats: WindowStats) -> dict[str, Any]:
    """What an evaluation found, as its decision's data (events, tuning.json, the page)."""
    return {"old_length": bounds.current, "new_length": choice.length,
            "measured_speedup": rounded(choice.current_speedup, 3),
            "predicted_speedup": rounded(choice.predicted_speedup, 3),
            "predicted_gain": rounded(choice.gain, 3), "draft_cost": rounded(choice.draft_cost, 3),
            "step_overhead": rounded(choice.overhead, 3), "decay": rounded(choice.decay, 3),
            "cost_split_from": "this regime" if split_here else (
                "earlier fit" if memory.cost_split else None),
            "baseline_tps": rounded(memory.baseline_tps, 3), "drift": drift,
            "measured": {str(k): rounded(v.speedup, 3) for k, v in sorted(so_far.items())},
            "evidence": stats.to_dict()}


def evaluate(memory: TunerMemory, stats: WindowStats, settings: Tuning, bounds: Bounds,
             now: float, drift: bool, load: Summary | None = None) -> Decision:
    """Judge the current length on `stats` against the baseline: disable, retune, explore or keep."""
    assert memory.baseline_tps is not None and stats.tokens_per_second
    mix = judge(load or {}, memory.baseline_by_load)
    ev = Evidence(bounds.current, stats.per_position_rate, stats.draft_fraction,
                  stats.mean_draft_size or float(bounds.current), stats.tokens_per_second,
                  memory.baseline_tps, mix.speedup if mix else None,
                  mix.by_load if mix else {})
    low, high = (bounds.low, bounds.high) if bounds.tunable else (bounds.current, bounds.current)
    earlier = _reweighed(memory.measurements(), mix)
    choice = choose(ev, low, high, settings.off_margin, earlier, SEARCH_LIMIT, settings.min_gain,
                    memory.prior())
    current = measurement(ev)
    measured = {**memory.measured, str(bounds.current): asdict(current)}
    so_far = {**earlier, bounds.current: current}
    split = split_of(list(so_far.values()))
    memory = replace(memory, measured=measured,
                     cost_split=[round(x, 6) for x in split] if split else memory.cost_split)
    data = _judged(choice, bounds, memory, bool(split), drift, so_far, stats)
    if mix is not None:
        data["by_load"] = mix.to_dict()
    if choice.length is None:
        best = max(choice.predictions.values())
        off = replace(memory, phase=OFF, last_change=now, last_decision=data,
                      disables=memory.disables + 1)
        return Decision(Action.DISABLE, off,
                        f"speculation does not pay: {choice.current_speedup:.2f}x at length "
                        f"{bounds.current} and at best {best:.2f}x predicted within "
                        f"[{low}, {high}], under the {settings.off_margin:.0%} margin; "
                        "turning it off", data)
    memory = replace(memory, disables=0)  # speculation pays: the re-probe wait starts over
    if choice.length != bounds.current and choice.gain >= settings.min_gain:
        return Decision(Action.RETUNE, replace(memory, length=choice.length, last_change=now,
                                               last_decision=data),
                        f"draft length {bounds.current} -> {choice.length}: predicted "
                        f"{choice.predicted_speedup:.2f}x vs {choice.current_speedup:.2f}x now "
                        f"(+{choice.gain:.0%}) over {stats.drafts} verification steps", data)
    target, predicted, said = _explore(choice, len(measured), bounds.current, settings,
                                       memory.cost_split is not None)
    if said is not None and target is not None:
        data = {**data, "new_length": target, "predicted_gain": rounded(predicted, 3),
                "predicted_speedup": rounded(
                    choice.predictions.get(target, choice.probe_speedup), 3)}
        return Decision(Action.EXPLORE, replace(memory, length=target, last_change=now,
                                                last_decision=data),
                        f"draft length {bounds.current} -> {target} to measure it: {said}",
                        data)
    return Decision(Action.KEEP, replace(memory, last_decision=data),
                    f"keeping draft length {bounds.current}: {choice.current_speedup:.2f}x "
                    f"measured, best alternative {choice.predicted_speedup:.2f}x", data)


def _explore(choice: Choice, n_measured: int, current: int, settings: Tuning,
             split_known: bool) -> tuple[int | None, float, str | None]:
    """The length worth one restart to measure, its predicted gain and why; (None, 0, None)
    when none is. Only while a single length has been measured in this regime, and no cost
    split was fitted earlier: with one, the model already tells a drafted step's fixed cost
    from its per-token cost, and a predicted gain under `min_gain` does not pay for the
    restart (run 12 of tuner_phases restarted a warm ngram-mod for a predicted +3 %)."""
    if n_measured >= 2 or split_known:
        return None, 0.0, None
    target = choice.model_best
    predicted = (choice.predictions[target] / choice.current_speedup - 1.0
                 if target is not None else 0.0)
    # Explore only a promising length (at least half the gain a retune needs): a restart
    # to measure a predicted +1 % costs more than it can return.
    if target is not None and target != current and predicted >= settings.min_gain / 2:
        return target, predicted, (f"the model predicts {predicted:+.0%} from one measured "
                                   "length; a second point fits the cost of drafting")
    if choice.probe is not None and choice.probe_speedup:
        bound = choice.probe_speedup / choice.current_speedup - 1.0
        if bound >= settings.min_gain:
            # One point cannot split a drafted step's cost into fixed and per-token parts;
            # the model assumed all per-token, and at the other end the longer draft gains
            # `bound`.
            return choice.probe, bound, (
                "one measured length cannot tell a drafted step's fixed cost from its "
                f"per-token cost, and with the cost all fixed {choice.probe} would give up "
                f"to {bound:+.0%}; a second point decides")
    return None, 0.0, None


def _reweighed(measured: dict[int, Measurement],
               mix: MixJudgement | None) -> dict[int, Measurement]:
    """Lengths measured earlier, their speedups taken over today's mix of loads (a bucket a
    length was not measured at takes that length's own overall speedup)."""
    if mix is None:
        return measured
    return {k: replace(m, speedup=over_mix(m.by_load, mix.weights, m.speedup))
            if m.by_load else m for k, m in measured.items()}
