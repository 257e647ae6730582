"""The tuner's decision layer with plain values: evidence, cooldown, baseline, explore, off."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.config.schema import Tuning
from supervisor.tuning.decisions import Bounds, plan
from supervisor.tuning.store import BASELINE, OFF, SPECULATING, TunerMemory
from supervisor.tuning.window import WindowStats

SETTINGS = Tuning(min_tokens=100, min_steps=20, cooldown=60, reprobe=600)
BOUNDS = Bounds(current=4, low=1, high=16, tunable=True)


def stats(drafts=50, tokens=400, seconds=4.0, rates=(0.9, 0.8, 0.7, 0.6)) -> WindowStats:
    accepted = round(drafts * sum(rates))
    return WindowStats(drafts=drafts, draft_tokens=drafts * len(rates), accepted=accepted,
                       tokens=tokens, seconds=seconds, per_position_rate=rates, deltas=5)


def test_nothing_happens_without_enough_traffic():
    assert plan(TunerMemory("x"), stats(tokens=50), SETTINGS, BOUNDS, 0.0, False) is None


def test_a_baseline_is_measured_first_then_speculation_comes_back():
    d = plan(TunerMemory("x"), stats(), SETTINGS, BOUNDS, 0.0, False)
    assert d.action == "baseline" and d.memory.phase == BASELINE and not d.memory.speculation
    no_drafts = WindowStats(0, 0, 0, 300, 3.0, (), 3)
    d2 = plan(d.memory, no_drafts, SETTINGS, BOUNDS, 10.0, False)
    assert d2.action == "restore" and d2.memory.phase == SPECULATING
    assert d2.memory.baseline_tps == 100.0


def test_cooldown_blocks_a_second_change_unless_acceptance_drifted():
    memory = TunerMemory("x", baseline_tps=50.0, last_change=0.0)
    assert plan(memory, stats(), SETTINGS, BOUNDS, 30.0, drift=False) is None
    assert plan(memory, stats(), SETTINGS, BOUNDS, 30.0, drift=True) is not None


def test_slower_than_baseline_turns_speculation_off_and_reprobes_later():
    memory = TunerMemory("x", baseline_tps=200.0)  # window: 100 tok/s -> 0.5x
    d = plan(memory, stats(), SETTINGS, BOUNDS, 1000.0, False)
    assert d.action == "disable" and d.memory.phase == OFF
    assert d.data["measured_speedup"] == 0.5
    assert plan(d.memory, stats(), SETTINGS, BOUNDS, 1300.0, False) is None
    assert plan(d.memory, stats(), SETTINGS, BOUNDS, 1700.0, False).action == "enable"


def test_a_single_measurement_leads_to_one_exploration_then_to_a_decision_on_two():
    memory = TunerMemory("x", baseline_tps=80.0)  # 1.25x at length 4
    d = plan(memory, stats(rates=(0.95, 0.93, 0.91, 0.9)), SETTINGS, BOUNDS, 1000.0, False)
    assert d.action in ("retune", "explore")
    assert d.memory.length != 4 and set(d.memory.measured) == {"4"}
    later = Bounds(current=d.memory.length, low=1, high=16, tunable=True)
    worse = stats(seconds=8.0)  # the new length measured slower: 0.62x
    back = plan(d.memory, worse, SETTINGS, later, 2000.0, False)
    # Away from the slower one: to 4, or shorter where the cost the two fit predicts it
    # faster (the exploration went to 8, a doubling: speedup.choose's reach).
    assert back.action == "retune" and back.memory.length <= 4 < d.memory.length
    assert set(back.memory.measured) == {"4", str(d.memory.length)}


def test_a_tiny_possible_gain_is_not_worth_a_restart_even_to_explore():
    # Acceptance falls off fast: even if a drafted step's cost were all fixed, a longer
    # draft would add almost nothing.
    memory = TunerMemory("x", baseline_tps=80.0)
    d = plan(memory, stats(rates=(0.9, 0.5, 0.2, 0.05)), SETTINGS, BOUNDS, 1000.0, False)
    assert d.action == "keep"
    assert 0 <= d.data["predicted_gain"] < SETTINGS.min_gain / 2


def test_drafts_still_accepted_at_the_limit_are_measured_at_twice_the_length():
    # From one point the model takes a drafted step's cost as all per-token and predicts
    # next to nothing for longer drafts; with the cost all fixed, 8 could give +22 %: one
    # restart measures a second point, which fits the split.
    memory = TunerMemory("x", baseline_tps=80.0)
    d = plan(memory, stats(), SETTINGS, BOUNDS, 1000.0, False)
    assert d.action == "explore" and d.memory.length == 8
    assert d.data["predicted_gain"] >= SETTINGS.min_gain
    assert "fixed cost from its per-token cost" in d.reason
    # Measured: 8 is no better. Two points now: no further exploring, back to the best.
    later = Bounds(current=8, low=1, high=16, tunable=True)
    same = plan(d.memory, stats(rates=(0.9, 0.8, 0.7, 0.6, 0.1, 0.05, 0.0, 0.0), seconds=4.4),
                SETTINGS, later, 2000.0, False)
    assert same.action == "retune" and same.memory.length == 4


def test_methods_with_nothing_to_tune_are_only_switched_on_or_off():
    fixed = Bounds(current=8, low=1, high=16, tunable=False)
    memory = TunerMemory("x", baseline_tps=80.0)
    d = plan(memory, stats(rates=(0.9,) * 8), SETTINGS, fixed, 1000.0, False)
    assert d.action == "keep"
    assert set(d.data["measured"]) == {"8"}


def test_evidence_from_before_the_baseline_is_judged_as_soon_as_the_baseline_is_known():
    # With speculation: 100 tok/s. Without (the baseline run): 200 tok/s. No restore needed.
    first = plan(TunerMemory("x"), stats(), SETTINGS, BOUNDS, 0.0, False)
    assert first.action == "baseline" and first.memory.before_baseline is not None
    spec_off = WindowStats(0, 0, 0, 400, 2.0, (), 3)
    d = plan(first.memory, spec_off, SETTINGS, BOUNDS, 10.0, False)
    assert d.action == "disable" and d.memory.phase == OFF
    assert d.memory.baseline_tps == 200.0 and d.data["measured_speedup"] == 0.5
    assert d.data["evidence"]["acceptance_rate"] is not None  # the speculative window
    assert d.reason.startswith("baseline measured: 200.0 tokens/s")


def test_a_window_too_small_before_the_baseline_just_restores_speculation():
    first = plan(TunerMemory("x"), stats(drafts=5), SETTINGS, BOUNDS, 0.0, False)
    d = plan(first.memory, WindowStats(0, 0, 0, 400, 2.0, (), 3), SETTINGS, BOUNDS, 10.0, False)
    assert d.action == "restore" and d.memory.speculation and d.memory.measured == {}


def test_reprobes_that_find_speculation_still_not_paying_back_off():
    memory = TunerMemory("x", baseline_tps=200.0)  # window: 100 tok/s -> 0.5x
    off = plan(memory, stats(), SETTINGS, BOUNDS, 0.0, False).memory
    assert off.disables == 1
    assert plan(off, stats(), SETTINGS, BOUNDS, 700.0, False).action == "enable"
    # The re-probe measured 0.5x again: the next one waits twice as long.
    again = plan(replace(off, phase=SPECULATING, last_change=700.0), stats(), SETTINGS,
                 BOUNDS, 800.0, False).memory
    assert again.phase == OFF and again.disables == 2
    assert plan(again, stats(), SETTINGS, BOUNDS, 800.0 + 1100.0, False) is None
    assert plan(again, stats(), SETTINGS, BOUNDS, 800.0 + 1300.0, False).action == "enable"
    # Capped: after many, at most 8x the re-probe.
    many = replace(again, disables=20)
    assert plan(many, stats(), SETTINGS, BOUNDS, 800.0 + 8 * 600 + 1, False).action == "enable"
    # A re-probe that pays starts the wait over.
    pays = plan(replace(again, phase=SPECULATING, last_change=0.0, baseline_tps=50.0), stats(),
                SETTINGS, BOUNDS, 5000.0, False)
    assert pays.memory.disables == 0 and pays.memory.phase == SPECULATING


def window_at(k: int, a: float, b: float, rates=(0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55),
              drafts: int = 50, baseline: float = 100.0) -> WindowStats:
    """A window as a server whose drafted step costs a + b*k plain steps would show it."""
    accepted = round(drafts * sum(rates[:k]))
    tokens = drafts + accepted
    speedup = (1 + accepted / drafts) / (1 + a + b * k)
    return WindowStats(drafts=drafts, draft_tokens=drafts * k, accepted=accepted,
                       tokens=tokens, seconds=tokens / (baseline * speedup),
                       per_position_rate=tuple(rates[:k]), deltas=5)


def test_the_cost_split_fitted_on_two_lengths_is_kept_for_the_next_single_measurement():
    from supervisor.tuning.decisions import evaluate

    memory = TunerMemory("x", baseline_tps=100.0)
    first = evaluate(memory, window_at(4, 0.5, 0.05), SETTINGS, BOUNDS, 0.0, False)
    assert first.memory.cost_split is None  # one length cannot split the cost
    at8 = Bounds(current=8, low=1, high=16, tunable=True)
    second = evaluate(first.memory, window_at(8, 0.5, 0.05), SETTINGS, at8, 100.0, False)
    a, b = second.memory.cost_split
    assert (a, b) == (pytest.approx(0.5, abs=0.02), pytest.approx(0.05, abs=0.005))
    # Another workload (a drift, or another variant) clears the measurements, not the split:
    fresh = replace(second.memory, measured={})
    third = evaluate(fresh, window_at(8, 0.5, 0.05, rates=(0.5,) * 8), SETTINGS, at8, 200.0,
                     False)
    assert third.data["cost_split_from"] == "earlier fit"
    assert third.data["step_overhead"] == pytest.approx(0.5, abs=0.02)


def test_with_a_cost_split_fitted_earlier_a_small_predicted_gain_is_not_explored():
    # The same single measurement with and without a split fitted on two lengths earlier
    # (another regime or variant): without, a predicted gain under min_gain is worth one
    # restart to fit the model; with, the model is as good as a second point would make it.
    memory = TunerMemory("x", baseline_tps=80.0)
    evidence = stats(rates=(0.9, 0.7, 0.5, 0.3))
    fresh = plan(memory, evidence, SETTINGS, BOUNDS, 1000.0, False)
    known = plan(replace(memory, cost_split=[0.05, 0.02]), evidence, SETTINGS, BOUNDS,
                 1000.0, False)
    assert fresh.action == "explore", fresh.reason
    assert known.action == "keep", known.reason
    assert known.data["predicted_gain"] < SETTINGS.min_gain


def test_a_reprobe_runs_a_short_draft_and_a_method_without_lengths_as_it_was():
    off = TunerMemory("x", baseline_tps=200.0, phase=OFF, last_change=0.0, length=12)
    long = Bounds(current=12, low=1, high=64, tunable=True)
    d = plan(off, stats(), SETTINGS, long, 700.0, False)
    assert d.action == "enable" and d.memory.length == 2 and d.data["length"] == 2
    assert "at length 2" in d.reason
    floor = Bounds(current=12, low=8, high=64, tunable=True)  # shortest allowed is longer
    assert plan(off, stats(), SETTINGS, floor, 700.0, False).memory.length == 8
    fixed = Bounds(current=12, low=1, high=64, tunable=False)
    assert plan(off, stats(), SETTINGS, fixed, 700.0, False).memory.length == 12


def test_a_setting_that_loses_most_of_the_throughput_is_judged_at_once():
    # 0.25x the baseline, 10 steps (half of min_steps), 10 s into a 60 s cool-down: judged.
    memory = TunerMemory("x", baseline_tps=400.0, last_change=0.0)
    d = plan(memory, stats(drafts=10), SETTINGS, BOUNDS, 10.0, False)
    assert d is not None and d.action == "disable"
    # Fewer than a quarter of min_steps is not evidence even then.
    assert plan(memory, stats(drafts=4), SETTINGS, BOUNDS, 10.0, False) is None
    # A setting that merely loses a little waits for the cool-down and min_steps as before.
    mild = TunerMemory("x", baseline_tps=110.0, last_change=0.0)  # 0.91x
    assert plan(mild, stats(), SETTINGS, BOUNDS, 10.0, False) is None
    assert plan(mild, stats(drafts=10), SETTINGS, BOUNDS, 100.0, False) is None


def test_a_busier_server_than_the_baseline_saw_is_not_taken_for_a_losing_setting():
    # The window ran at 8 requests at a time, the baseline only at 1: per-request speed is
    # a quarter of the baseline's, which says nothing about the setting.
    memory = TunerMemory("x", baseline_tps=400.0, last_change=0.0, baseline_by_load={"1": 400.0})
    assert plan(memory, stats(drafts=10), SETTINGS, BOUNDS, 10.0, False, {"8": (400, 100.0)}) is None
    # Where the baseline saw that load, the judgement is over the mix: losing, judged at once.
    seen = replace(memory, baseline_by_load={"1": 400.0, "8": 400.0})
    d = plan(seen, stats(drafts=10), SETTINGS, BOUNDS, 10.0, False, {"8": (400, 100.0)})
    assert d is not None and d.action == "disable"


def test_a_setting_losing_where_its_workload_measured_speculation_paying_means_a_new_workload():
    from supervisor.tuning.decisions import contradicted

    paid = {"11": {"speedup": 1.22, "draft_fraction": 0.9, "mean_draft_size": 11.0,
                   "accepted_per_draft": 5.0}}
    memory = TunerMemory("x", baseline_tps=400.0, measured=paid)  # window 100 tok/s: 0.25x
    said = contradicted(memory, stats(drafts=10), {}, 20, 13)
    assert said is not None and "0.25x the baseline at length 13" in said and "1.22x" in said
    # Not where this workload never paid, nor for a mild loss, nor on too little evidence.
    assert contradicted(replace(memory, measured={"11": {**paid["11"], "speedup": 0.9}}),
                        stats(drafts=10), {}, 20, 13) is None
    assert contradicted(replace(memory, baseline_tps=110.0), stats(), {}, 20, 13) is None
    assert contradicted(memory, stats(drafts=4), {}, 20, 13) is None
    assert contradicted(replace(memory, phase=OFF), stats(drafts=10), {}, 20, 13) is None


def test_a_length_measured_paying_that_falls_with_its_acceptance_means_a_new_workload():
    """Run 18 of tuner_phases: a window straddling code and prose read 16 at 0.65x accepting
    0.43, where code had measured 16 at 1.18x accepting 0.98; booked as a measurement, it
    replaced code's 1.18x in code's regime."""
    from supervisor.tuning.decisions import contradicted

    paid = {"16": {"speedup": 1.18, "draft_fraction": 0.9, "mean_draft_size": 14.0,
                   "accepted_per_draft": 12.0}}
    memory = TunerMemory("x", baseline_tps=100.0, measured=paid)
    straddled = stats(drafts=40, tokens=260, seconds=4.0, rates=(0.6, 0.45, 0.35, 0.3))
    said = contradicted(memory, straddled, {}, 20, 16, seen=0.98)
    assert said is not None and "length 16 reads 0.65x" in said and "1.18x accepting 0.98" in said
    # Either fall alone is no change: throughput (the acceptance held), acceptance (the
    # throughput held), nor a length this workload has not measured, nor without a judgement.
    assert contradicted(memory, straddled, {}, 20, 16, seen=0.55) is None
    assert contradicted(memory, stats(drafts=40, tokens=1100, seconds=10.0,
                                      rates=(0.6, 0.45, 0.35, 0.3)), {}, 20, 16, seen=0.98) is None
    assert contradicted(memory, straddled, {}, 20, 11, seen=0.98) is None
    assert contradicted(memory, straddled, {}, 20, 16) is None


def test_time_off_measures_the_baseline_again_and_a_re_probe_is_judged_against_it():
    """Run 17 of tuner_phases: a baseline read 38.6 tokens/s once (off served 27.1 in the
    phase that followed), 6 at 0.95x and 2 at 0.77x were judged against it, and code was
    served off. The tokens served off are the baseline, measured for free."""
    low = {"speedup": 0.77, "draft_fraction": 1.0, "mean_draft_size": 2.0,
           "accepted_per_draft": 1.9}
    memory = TunerMemory("x", phase=OFF, baseline_tps=38.6, last_change=0.0,
                         baseline_by_load={"1": 38.6}, measured={"2": low})
    off = stats(drafts=0, tokens=271, seconds=10.0, rates=())
    d = plan(memory, off, SETTINGS, BOUNDS, 1000.0, False, {"1": (271, 27.1)})
    assert d.action == "enable" and d.data["baseline_refreshed"] == {"1": [38.6, 27.1]}
    assert d.memory.baseline_by_load == {"1": 27.1} and d.memory.baseline_tps == pytest.approx(27.1)
    assert d.memory.measured["2"]["speedup"] == pytest.approx(0.77 * 38.6 / 27.1, abs=1e-4)
    # A load the baseline lacked is measured too; the speedups judged at the others stay.
    busy = plan(memory, off, SETTINGS, BOUNDS, 1000.0, False, {"4-7": (271, 60.0)})
    assert busy.memory.baseline_by_load == {"1": 38.6, "4-7": 60.0}
    assert busy.memory.measured == {"2": low}
    # Not from a window that drafted, nor from too few tokens, nor before the re-probe is due.
    for window in (stats(drafts=5, tokens=271, seconds=10.0), stats(drafts=0, tokens=50,
                                                                      seconds=2.0, rates=())):
        d = plan(memory, window, SETTINGS, BOUNDS, 1000.0, False, {"1": (271, 27.1)})
        assert d.memory.baseline_by_load == {"1": 38.6} and "baseline_refreshed" not in d.data
    assert plan(memory, off, SETTINGS, BOUNDS, 10.0, False, {"1": (271, 27.1)}) is None


def test_the_tuner_leaves_a_regime_whose_own_length_falls_with_its_acceptance(tmp_path):
    """The wiring of the rule above: the acceptance judged at the running setting is what
    the window is compared with, and the regime is kept with its own number."""
    import time as clock

    from supervisor.plugin.backend import RuntimeInfo
    from tests.test_autotune import make, sample

    tuner, events = make(tmp_path, cooldown=3600)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    paid = {"speedup": 1.5, "draft_fraction": 1.0, "mean_draft_size": 8.0,
            "accepted_per_draft": 7.6}
    tuner._remember(replace(tuner.memory, phase=SPECULATING, baseline_tps=100.0,
                            measured={"8": paid}, last_change=clock.time()))
    tuner._seen = {"-:8": 0.95}
    tuner.observe(sample(0, 0, 0, 0.0))
    tuner.observe(sample(10, 7.6, 200, 1.0))  # a learning drafter's first tokens: not judged
    tuner.observe(sample(110, 3.24, 900, 11.0))  # 0.7x the baseline, accepting 0.40
    said = [e[1] for e in events]
    assert any("length 8 reads 0.70x" in s and "1.50x accepting 0.95" in s for s in said), said
    assert [r["measured"] for r in tuner.memory.regimes] == [{"8": paid}]
