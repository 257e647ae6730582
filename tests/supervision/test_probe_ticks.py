"""Health probes and metrics reads wait for the next tick of their interval, so that every
target with the same interval is read in the same wake-up of the daemon (supervisor/supervision/
probes.py; the CPU it saves is measured by benchmarks/daemon_overhead.py)."""

from __future__ import annotations

import itertools

import pytest

from supervisor.supervision.probes import TICK_SLACK, to_next_tick


@pytest.mark.parametrize("interval", [0.5, 1.0, 5.0, 15.0])
def test_targets_started_at_different_times_are_read_at_the_same_instants(interval):
    for started in (0.0, 3.25, 7.9, 1234.5678):
        now, reads = started, []
        for _ in range(3):
            now += to_next_tick(now, interval)
            reads.append(now)
        ticks = [r / interval for r in reads]
        assert ticks == pytest.approx([round(t) for t in ticks], abs=1e-9)
        assert [b - a for a, b in itertools.pairwise(reads)] == pytest.approx([interval] * 2)


def test_a_wake_up_a_hair_before_its_tick_does_not_read_twice():
    assert to_next_tick(9.9999999, 1.0) == pytest.approx(1.0000001)
    assert to_next_tick(10.0, 1.0) == pytest.approx(1.0)
    assert to_next_tick(10.5, 1.0) == pytest.approx(0.5)
    assert min(to_next_tick(t / 1000, 0.01) for t in range(1000)) >= TICK_SLACK
