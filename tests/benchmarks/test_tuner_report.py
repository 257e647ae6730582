"""benchmarks/tuner_report.py's downtime accounting: what tuner_phases charges a strategy
for its restarts. Pure, on event sequences shaped as the daemon writes them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from tuner_report import down_intervals


def state(t: float, old: str, new: str, target: str = "rule") -> dict:
    return {"time": t, "target": target, "kind": "state", "old": old, "new": new}


def test_a_restart_in_place_is_down_from_leaving_ready_until_ready_again():
    events = [state(1, "loading", "ready"), state(10, "ready", "stopping"),
              state(11, "stopping", "stopped"), state(12, "stopped", "starting"),
              state(13, "starting", "loading"), state(20, "loading", "ready")]
    assert down_intervals(events, "rule", end=100) == [(10, 20)]


def test_a_restart_beside_is_not_down_when_the_old_server_drains_after_the_new_is_ready():
    # The new supervisor's server is ready at 20; the old one leaves ready at 21 to drain.
    events = [state(1, "loading", "ready"), state(12, "stopped", "starting"),
              state(13, "starting", "loading"), state(20, "loading", "ready"),
              state(21, "ready", "stopping"), state(25, "stopping", "stopped")]
    assert down_intervals(events, "rule", end=100) == []


def test_after_a_restart_beside_the_one_server_left_leaving_ready_is_down():
    events = [state(1, "loading", "ready"), state(20, "loading", "ready"),
              state(21, "ready", "stopping"), state(50, "ready", "backoff"),
              state(60, "loading", "ready")]
    assert down_intervals(events, "rule", end=100) == [(50, 60)]


def test_down_at_the_end_is_counted_to_the_end_and_other_targets_are_ignored():
    events = [state(0, "starting", "loading"), state(1, "loading", "ready"),
              state(5, "ready", "stopping", target="tuned"), state(90, "ready", "stopping")]
    assert down_intervals(events, "rule", end=100) == [(90, 100)]
