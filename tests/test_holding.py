"""How long a decision that needs a restart waits for an idle server (tuning/holding.py)."""

from __future__ import annotations

from supervisor.tuning.holding import hold


def test_a_restart_beside_the_running_server_does_not_wait():
    assert hold(600, 10.0, 0.2, 0.05, free=True).seconds == 0


def test_a_restart_in_place_waits_until_waiting_costs_more_than_restarting():
    assert hold(600, 10.0, 0.2, 0.05, free=False).seconds == 50  # 10 s / 20 %
    assert hold(600, 10.0, None, 0.05, free=False).seconds == 200  # valued at min_gain
    assert hold(600, 10.0, -0.1, 0.05, free=False).seconds == 200


def test_max_wait_bounds_the_wait_and_is_the_bound_before_any_start_was_timed():
    assert hold(60, 10.0, 0.01, 0.05, free=False).seconds == 60
    waits = hold(600, None, 0.2, 0.05, free=False)
    assert waits.seconds == 600 and "tuning.max_wait" in waits.why
