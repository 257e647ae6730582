"""The tuner, the drift detector and the acceptance window on synthetic sequences."""

from __future__ import annotations

import random

import pytest

from supervisor.plugin.backend import MetricsSample
from supervisor.tuning.drift import PageHinkley
from supervisor.tuning.speedup import Evidence, choose, expected_accepted, fit_decay, predict_speedup
from supervisor.tuning.window import AcceptanceWindow


def geometric(p0: float, r: float, k: int) -> tuple[float, ...]:
    return tuple(p0 * r**i for i in range(k))


def evidence_for(rates, length, cost, f=1.0, baseline=100.0) -> Evidence:
    """Evidence as a server with true draft cost `cost` would produce it."""
    accepted = f * sum(rates[:length])
    tps = baseline * (1 + accepted) / (1 + cost * f * length)
    return Evidence(length, tuple(rates[:length]), f, float(length), tps, baseline)


def test_decay_fit_recovers_a_geometric_profile():
    assert fit_decay(geometric(0.9, 0.8, 6)) == pytest.approx(0.8)
    assert fit_decay((0.5,)) == 0.5
    assert fit_decay(()) == 0.0


def test_extrapolation_beyond_the_measured_length_follows_the_fit():
    rates = geometric(0.9, 0.8, 4)
    assert expected_accepted(rates, 2, 0.8) == pytest.approx(0.9 + 0.72)
    assert expected_accepted(rates, 6, 0.8) == pytest.approx(sum(geometric(0.9, 0.8, 6)))


def test_the_draft_cost_is_recovered_from_measured_throughput():
    truth = geometric(0.9, 0.85, 16)
    ev = evidence_for(truth, 4, cost=0.1)
    choice = choose(ev, 1, 16, off_margin=0.03)
    assert choice.draft_cost == pytest.approx(0.1, rel=1e-6)
    assert choice.current_speedup == pytest.approx(predict_speedup(ev, 4, 0.1, 0.85))


def test_high_acceptance_and_cheap_drafts_raise_the_length_to_the_true_optimum():
    truth = geometric(0.95, 0.9, 32)
    cost = 0.05
    best_true = max(range(1, 33), key=lambda k: (1 + sum(truth[:k])) / (1 + cost * k))
    choice = choose(evidence_for(truth, 4, cost), 1, 32, 0.03)
    assert choice.length == 8 and choice.model_best == best_true  # a doubling at a time
    assert choice.gain > 0.05
    choice = choose(evidence_for(truth, 8, cost), 1, 32, 0.03)
    assert choice.length == best_true


def test_a_short_draft_accepted_in_full_is_not_extrapolated_to_the_longest_length():
    # Run 16 of tuner_phases: length 2 accepted in full on code, and 2 -> 64 was predicted
    # 1.25x where the true best lies far shorter; the next length tried is 4.
    truth = (1.0, 1.0, *geometric(0.9, 0.7, 62))
    choice = choose(evidence_for(truth, 2, cost=0.15), 2, 64, 0.03)
    assert choice.model_best > 4 and choice.length == 4


def test_low_acceptance_lowers_the_length():
    truth = geometric(0.5, 0.6, 16)
    choice = choose(evidence_for(truth, 16, cost=0.08), 1, 16, 0.03)
    assert choice.length is not None and choice.length < 6


def test_a_draft_as_expensive_as_the_target_turns_speculation_off():
    # The self-draft case: 98 % acceptance and still slower, because c is about 1.
    truth = geometric(0.98, 0.99, 16)
    choice = choose(evidence_for(truth, 4, cost=1.0), 1, 16, 0.03)
    assert choice.length is None
    assert choice.current_speedup < 1.0
    assert choice.gain > 0


def test_bounds_are_respected():
    truth = geometric(0.95, 0.95, 64)
    choice = choose(evidence_for(truth, 4, cost=0.01), 2, 8, 0.03)
    assert choice.length == 8
    assert set(choice.predictions) == set(range(2, 9))


def test_ngram_style_sparse_drafting_is_modelled_through_the_draft_fraction():
    truth = geometric(0.9, 0.95, 64)
    ev = evidence_for(truth, 16, cost=0.02, f=0.3)
    choice = choose(ev, 4, 64, 0.03)
    assert choice.draft_cost == pytest.approx(0.02, rel=1e-6)
    assert choice.length is not None and choice.length > 16


def test_drift_is_silent_on_a_steady_noisy_sequence():
    rng = random.Random(7)
    ph = PageHinkley()
    verdicts = [ph.update(min(1, max(0, rng.gauss(0.8, 0.05)))) for _ in range(500)]
    assert not any(verdicts)


def test_drift_flags_a_sustained_step_down_within_a_few_observations():
    ph = PageHinkley()
    for _ in range(30):
        assert ph.update(0.8) is None
    flagged = [ph.update(0.45) for _ in range(12)]
    assert "down" in flagged
    assert flagged.index("down") <= 8


def test_drift_flags_a_step_up():
    ph = PageHinkley()
    for _ in range(30):
        ph.update(0.2)
    assert "up" in [ph.update(0.7) for _ in range(12)]


def test_single_odd_requests_do_not_trigger_drift():
    ph = PageHinkley()
    for i in range(200):
        odd = i % 25 == 0 and i > 0
        assert ph.update(0.0 if odd else 0.8) is None


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


def test_two_measured_lengths_separate_fixed_step_overhead_from_per_token_cost():
    from supervisor.tuning.speedup import Measurement, fit_cost

    def at(d: float, a: float, b: float, f: float = 0.3, acc: float | None = None) -> Measurement:
        acc = d if acc is None else acc
        return Measurement((1 + f * acc) / (1 + f * (a + b * d)), f, d, acc)

    a, b = fit_cost([at(4, 0.9, 0.45), at(48, 0.9, 0.45)])
    assert (a, b) == (pytest.approx(0.9), pytest.approx(0.45))
    # One point: all of the cost is attributed per token.
    a1, b1 = fit_cost([at(4, 0.9, 0.45)])
    assert a1 == 0 and b1 == pytest.approx((0.9 + 0.45 * 4) / 4)


def test_measured_lengths_outrank_the_model():
    from supervisor.tuning.speedup import Measurement

    truth = geometric(0.95, 0.95, 32)
    ev = evidence_for(truth, 4, cost=0.05)
    model_only = choose(ev, 1, 32, 0.03)
    assert model_only.length is not None and model_only.length > 4
    # ... but if that length was measured and found slow, the tuner believes the measurement.
    slow = {model_only.length: Measurement(0.5, 1.0, float(model_only.length), 5.0)}
    informed = choose(ev, 1, 32, 0.03, slow)
    assert informed.length != model_only.length
    assert informed.predictions[model_only.length] == 0.5


def _measured_as_modelled(ev: Evidence, truth, cost: float, lengths) -> dict:
    from supervisor.tuning.speedup import Measurement
    return {k: Measurement(predict_speedup(ev, k, cost, fit_decay(ev.per_position_rate)),
                           1.0, float(k), sum(truth[:k])) for k in lengths}


def test_a_length_beside_a_measured_one_is_predicted_from_that_measurement():
    from supervisor.tuning.speedup import Measurement

    truth = geometric(0.95, 0.98, 64)
    ev = evidence_for(truth, 16, cost=0.02)
    model_only = choose(ev, 1, 64, 0.03)
    assert model_only.predictions[47] > 1.5
    # 48 ran on another window and measured far below what this window's profile suggests:
    # 47 is judged by it, not by the model alone.
    slow = {48: Measurement(1.2, 1.0, 48.0, sum(truth[:48]))}
    informed = choose(ev, 1, 64, 0.03, slow)
    assert informed.predictions[47] == pytest.approx(1.2, rel=0.03)
    assert informed.length not in (47, 49)


def test_the_search_stops_at_the_best_measured_length_after_the_limit():
    truth = geometric(0.97, 0.99, 64)
    ev = evidence_for(truth, 4, cost=0.01)
    earlier = _measured_as_modelled(ev, truth, 0.01, (8, 16))
    free = choose(ev, 1, 64, 0.03, earlier)
    assert free.length not in (4, 8, 16)  # the model still sees a better length to try
    limited = choose(ev, 1, 64, 0.03, earlier, search_limit=3)
    assert limited.length == 16  # the best of the three measured
    assert set(limited.predictions) == {4, 8, 16}
    assert choose(ev, 1, 64, 0.03, earlier, search_limit=4).length == free.length


def test_an_untried_length_must_beat_the_best_measured_one_by_the_margin_to_be_tried():
    truth = geometric(0.97, 0.99, 64)
    ev = evidence_for(truth, 4, cost=0.01)
    earlier = _measured_as_modelled(ev, truth, 0.01, (16,))
    free = choose(ev, 1, 64, 0.03, earlier)
    assert free.length not in (4, 16)  # the model sees an untried length ahead of both
    best_known = max(free.predictions[4], free.predictions[16])
    ahead = free.predictions[free.length] / best_known - 1.0
    assert ahead > 0
    # Ahead of the best measured length by more than the margin: it is tried ...
    assert choose(ev, 1, 64, 0.03, earlier, try_margin=ahead * 0.9).length == free.length
    # ... by less: the best measured length runs instead (a restart to try a length
    # predicted barely better than a known one does not pay), not the current one.
    held = choose(ev, 1, 64, 0.03, earlier, try_margin=ahead * 1.1)
    assert held.length == 16 and held.predictions == free.predictions


def test_one_point_takes_the_split_of_its_cost_from_an_earlier_two_size_fit():
    from supervisor.tuning.speedup import Measurement, fit_cost, split_of

    def at(d: float, a: float, b: float, f: float = 0.5) -> Measurement:
        return Measurement((1 + f * d * 0.8) / (1 + f * (a + b * d)), f, d, d * 0.8)

    # A CPU where a drafted step costs mostly a fixed amount: a = 0.6, b = 0.01.
    split = split_of([at(16, 0.6, 0.01), at(25, 0.6, 0.01)])
    assert split == (pytest.approx(0.6), pytest.approx(0.01))
    assert split_of([at(16, 0.6, 0.01)]) is None  # one size cannot split it
    # Another text (another acceptance), one size measured: its cost splits like the fit's.
    a, b = fit_cost([at(48, 0.6, 0.01)], prior=split)
    assert (a, b) == (pytest.approx(0.6), pytest.approx(0.01))
    assert fit_cost([at(48, 0.6, 0.01)]) == (0.0, pytest.approx((0.6 + 0.48) / 48))


def test_with_a_prior_split_one_long_length_does_not_make_every_shorter_one_look_better():
    # The run-8 pattern: ngram simple measured at 48 alone; the all-per-token fit predicted
    # 17 at +27 %, and 17 measured slower than 48.
    truth, f, a, b = geometric(0.8, 0.9, 64), 0.4, 0.9, 0.02

    def true_speedup(k: int) -> float:
        return (1 + f * sum(truth[:k])) / (1 + f * (a + b * k))

    ev = Evidence(48, truth[:48], f, 48.0, 100.0 * true_speedup(48), 100.0)
    blind = choose(ev, 1, 64, 0.03)
    assert blind.predictions[17] > 1.15 * true_speedup(48)
    informed = choose(ev, 1, 64, 0.03, prior=(a, b))
    assert informed.predictions[17] == pytest.approx(true_speedup(17), rel=0.01)
    assert informed.predictions[17] < 1.05 * true_speedup(48)  # not worth a restart
    assert informed.probe is None  # the split is known: no probe to find it
