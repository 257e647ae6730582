"""The acceptance window: counter deltas from a runtime's cumulative /metrics."""

from __future__ import annotations

import pytest

from supervisor.plugin.backend import MetricsSample
from supervisor.tuning.window import AcceptanceWindow


def sample(start: float, drafts: int, accepted_per_pos: tuple[int, ...], tokens: int,
           seconds: float) -> MetricsSample:
    return MetricsSample(process_start=start, drafts=drafts,
                         draft_tokens=drafts * len(accepted_per_pos),
                         accepted_tokens=sum(accepted_per_pos),
                         accepted_per_position=accepted_per_pos, tokens_predicted=tokens,
                         tokens_predicted_seconds=seconds)


def test_window_turns_counter_deltas_into_per_position_rates():
    w = AcceptanceWindow()
    assert w.observe(sample(1.0, 10, (8, 6), 30, 1.0), now=0).drafts == 10
    assert w.observe(sample(1.0, 10, (8, 6), 30, 1.0), now=1) is None  # nothing finished
    w.observe(sample(1.0, 30, (24, 12), 90, 3.0), now=2)
    s = w.stats()
    assert s.drafts == 30 and s.per_position_rate == pytest.approx((0.8, 0.4))
    assert s.accepted_per_draft == pytest.approx(1.2)
    assert s.tokens_per_second == pytest.approx(30.0)
    assert s.draft_fraction == pytest.approx(30 / (90 - 36))


def test_window_survives_a_counter_reset_from_a_server_restart():
    w = AcceptanceWindow()
    w.observe(sample(1.0, 100, (90, 80), 400, 4.0), now=0)
    # New Process-Start-Time-Unix: the counters start again from zero.
    delta = w.observe(sample(2.0, 10, (5, 1), 30, 0.5), now=1)
    assert delta is not None and delta.drafts == 10 and delta.accepted == 6
    # A counter going down without a new start time is a reset too.
    delta = w.observe(sample(2.0, 4, (2, 0), 10, 0.1), now=2)
    assert delta is not None and delta.drafts == 4
    assert w.stats().drafts == 114


def test_window_is_bounded_by_steps_and_age():
    w = AcceptanceWindow(max_steps=50, max_age=100)
    total = 0
    for i in range(10):
        total += 20
        w.observe(sample(1.0, total, (total, 0), total * 3, float(total)), now=float(i))
    assert w.stats().drafts == 60  # three deltas: evicting one more would drop below 50
    w.observe(sample(1.0, total + 20, (total + 20, 0), (total + 20) * 3, total + 20.0), now=500)
    assert w.stats().drafts == 20
