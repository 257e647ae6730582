"""How long a decision that needs a restart waits for an idle server (tuning/holding.py)."""

from __future__ import annotations

from dataclasses import replace

from supervisor.tuning.decisions import Action, Decision
from supervisor.tuning.holding import hold, payback, weigh
from supervisor.tuning.store import TunerMemory


def test_a_restart_beside_the_running_server_does_not_wait():
    assert hold(600, 10.0, 0.2, 0.05, free=True).seconds == 0


def test_a_restart_in_place_waits_until_waiting_costs_more_than_restarting():
    assert hold(600, 10.0, 0.2, 0.05, free=False).seconds == 50  # 10 s / 20 %
    assert hold(600, 10.0, None, 0.05, free=False).seconds == 200  # valued at min_gain
    assert hold(600, 10.0, -0.1, 0.05, free=False).seconds == 200
    assert hold(600, 10.0, None, 0.0, free=False).seconds == 600  # min_gain 0: max_wait


def test_max_wait_bounds_the_wait_and_is_the_bound_before_any_start_was_timed():
    assert hold(60, 10.0, 0.01, 0.05, free=False).seconds == 60
    waits = hold(600, None, 0.2, 0.05, free=False)
    assert waits.seconds == 600 and "tuning.max_wait" in waits.why


def test_a_switch_pays_back_only_if_the_workload_lasts_long_enough():
    # In place: 10 s of nothing served at +20 % is paid back after 50 s of the workload.
    assert not payback(0.2, 10.0, False, 0.0, lasted=40).pays
    verdict = payback(0.2, 10.0, False, 0.0, lasted=60)
    assert verdict.pays and verdict.data["pays_back_after_s"] == 50
    # Beside the old server half the load is lost; a learning drafter's warm-up adds its time.
    assert payback(0.2, 10.0, True, 0.0, lasted=0).seconds == 25
    assert payback(0.2, 10.0, True, 30.0, lasted=0).seconds == 55
    assert payback(0.2, None, False, 0.0, lasted=0) is None  # no start timed: not weighed


def test_a_retune_that_does_not_pay_back_becomes_a_keep_with_its_measurement():
    memory = TunerMemory("f", length=8, last_change=5.0)
    retune = Decision(Action.RETUNE, replace(memory, length=4, last_change=100.0,
                                             measured={"8": {"speedup": 1.2}}),
                      "draft length 8 -> 4: predicted 1.40x vs 1.20x now (+17%)",
                      {"predicted_gain": 0.17})
    kept = weigh(retune, memory, 8, 20.0, False, 0.0, lasted=30.0)
    assert kept.action == Action.KEEP and kept.memory.length == 8
    assert kept.memory.last_change == 5.0 and kept.memory.measured == {"8": {"speedup": 1.2}}
    assert "would not pay back yet" in kept.reason and kept.data["pays_back_after_s"] > 30
    assert weigh(retune, memory, 8, 20.0, False, 0.0, lasted=1000.0).action == Action.RETUNE
    baseline = Decision(Action.BASELINE, memory, "measuring", {})
    assert weigh(baseline, memory, 8, 20.0, False, 0.0, lasted=0.0) is baseline
