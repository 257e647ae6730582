"""The requests' sampling as a workload signal (tuning/sampling.py): counted by the proxy's
book, watched for changes, kept with a regime and recalled by it, with speculation on or off."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from supervisor.config.schema import Tuning
from supervisor.supervision.requests import ProxyRequests
from supervisor.tuning.decisions import Action, Bounds, plan
from supervisor.tuning.regimes import recall_sampled, remember
from supervisor.tuning.sampling import GREEDY, SAMPLED, SamplingWatch, interleaved, sampling_class
from supervisor.tuning.store import OFF, SPECULATING, TunerMemory
from supervisor.tuning.window import WindowStats
from tests.test_autotune import make, sample

PAYS = {"speedup": 1.5, "draft_fraction": 1.0, "mean_draft_size": 12.0, "accepted_per_draft": 9.0}
LOSES = {**PAYS, "speedup": 0.3}


def test_a_request_is_greedy_at_temperature_zero_and_unknown_without_one():
    assert sampling_class({"temperature": 0}) == GREEDY
    assert sampling_class({"temperature": 0.0}) == GREEDY
    assert sampling_class({"temperature": 0.8}) == SAMPLED
    for body in ({}, {"temperature": None}, {"temperature": "0"}, {"temperature": True}):
        assert sampling_class(body) is None


def test_the_requests_of_an_interval_alternate_so_no_run_is_invented():
    assert interleaved(3, 1) == [1.0, 0.0, 1.0, 1.0]
    assert interleaved(0, 2) == [0.0, 0.0] and interleaved(0, 0) == []


def test_a_switch_to_greedy_is_seen_on_the_fifth_request_and_a_steady_mix_never():
    watch = SamplingWatch()
    assert watch.share is None
    for _ in range(40):
        assert watch.observe(0, 1) is None
    fired = [watch.observe(1, 0) for _ in range(5)]
    assert fired == [None, None, None, None, "up"]
    assert watch.left_share == 0.0 and watch.share == 1.0  # the new workload, seeded
    mixed = SamplingWatch()
    for _ in range(2000):
        assert mixed.observe(1, 1) is None
    assert abs(mixed.share - 0.5) < 1e-9
    for _ in range(12):  # a dozen greedy requests in a row within a mix: not a change
        assert mixed.observe(1, 0) is None
    # ... but a long run of them is: all-greedy after half-and-half shows on the 16th.
    assert [mixed.observe(1, 0) for _ in range(4)] == [None, None, None, "up"]


def test_the_proxy_book_counts_requests_by_sampling_until_taken():
    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        book = ProxyRequests()
        async with book.relaying(GREEDY), book.relaying(GREEDY), book.relaying(SAMPLED):
            pass
        async with book.relaying(None):  # no temperature: not counted
            pass
        return book.take_sampling(), book.take_sampling()

    assert asyncio.run(scenario()) == ((2, 1), (0, 0))


def test_a_regime_is_recalled_by_its_share_of_greedy_requests():
    code = remember([], {"mod:16": 0.9}, "mod", {"16": PAYS}, {}, now=1.0, greedy_share=1.0)
    both = remember(code, {"mod:16": 0.1}, "mod", {"16": LOSES}, {}, now=2.0, greedy_share=0.0)
    assert recall_sampled(both, 0.9)["measured"] == {"16": PAYS}
    assert recall_sampled(both, 0.1)["measured"] == {"16": LOSES}
    assert recall_sampled(both, 0.5) is None  # neither: another workload
    newer = remember(both, {"mod:8": 0.7}, "mod", {"8": PAYS}, {}, now=3.0, greedy_share=1.0)
    assert recall_sampled(newer, 1.0)["measured"] == {"8": PAYS}  # a tie: the most recent
    unknown = remember([], {"mod:16": 0.9}, "mod", {"16": PAYS}, {}, now=1.0)
    assert unknown[0]["greedy_share"] is None and recall_sampled(unknown, 1.0) is None


def off_memory(measured: dict) -> TunerMemory:
    return TunerMemory("f", phase=OFF, baseline_tps=50.0, last_change=100.0, disables=3,
                       measured=measured)


def test_a_changed_workload_ends_a_time_off_at_once_at_its_best_length_if_measured():
    settings = Tuning()
    bounds = Bounds(current=8, low=2, high=16, tunable=True)
    nothing = WindowStats(0, 0, 0, 0, 0.0, (), 0)
    assert plan(off_memory({}), nothing, settings, bounds, 101.0, False) is None  # re-probe later
    probe = plan(off_memory({}), nothing, settings, bounds, 101.0, True)
    assert probe.action == Action.ENABLE and probe.memory.length == 2
    assert probe.memory.disables == 0 and "workload changed" in probe.reason
    back = plan(off_memory({"12": PAYS, "4": {**PAYS, "speedup": 1.1}, "16": LOSES}), nothing,
                settings, bounds, 101.0, True)
    assert back.action == Action.ENABLE and back.memory.length == 12
    assert back.memory.phase == SPECULATING and back.data["recalled"] is True


def test_greedy_requests_after_sampled_ones_bring_a_kept_workload_back_while_off(tmp_path):
    tuner, events = make(tmp_path)
    code = remember([], {"-:12": 0.9}, tuner.variant, {"12": PAYS}, {}, now=1.0, greedy_share=1.0)
    tuner._remember(replace(off_memory({"8": LOSES}), fingerprint=tuner.memory.fingerprint,
                            last_change=time.time(), regimes=code))
    tuner._seen = {"-:8": 0.05}
    for _ in range(40):  # prose: sampled requests, speculation off, nothing to re-probe yet
        assert tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1)) is None
    reasons = [tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0)) for _ in range(5)]
    assert reasons[:4] == [None] * 4 and "seen before" in reasons[4]
    said = [e[1] for e in events]
    assert said[0].startswith("the share of greedy requests drifted up")
    assert events[1][2]["action"] == "recall" and events[1][2]["measured"] == {"12": 1.5}
    tuner.apply_pending()
    assert tuner.speculation_on and tuner.draft_length == 12
    prose = [r for r in tuner.memory.regimes if r["greedy_share"] == 0.0]
    assert prose and prose[0]["measured"] == {"8": LOSES}  # kept for its own return


def test_sampled_requests_while_speculating_on_greedy_ones_are_a_change_of_workload(tmp_path):
    tuner, events = make(tmp_path, min_steps=10_000)  # no decisions: watch the change alone
    tuner._remember(replace(tuner.memory, baseline_tps=50.0, measured={"8": PAYS}))
    tuner._seen = {"-:8": 0.9}
    for _ in range(40):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    assert not events
    for _ in range(5):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    assert [e[2]["direction"] for e in events] == ["down"]
    assert tuner.memory.measured == {}
    assert tuner.memory.regimes[-1]["greedy_share"] == 1.0


def test_more_sampled_requests_while_off_wait_for_the_next_re_probe(tmp_path):
    """Off because the draft did not pay, a move toward sampling will not make it pay: the
    change is noted (the regime is left) but the time off runs its course (run 15 of
    tuner_phases re-probed at once in prose and measured 0.36x off)."""
    tuner, events = make(tmp_path)
    tuner._remember(replace(off_memory({"8": LOSES}), fingerprint=tuner.memory.fingerprint,
                            last_change=time.time()))
    tuner._seen = {"-:8": 0.5}
    for _ in range(40):  # greedy requests, speculation off
        assert tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0)) is None
    reasons = [tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1)) for _ in range(5)]
    assert reasons == [None] * 5 and not tuner.speculation_on
    assert [e[2].get("direction") for e in events] == ["down"]
    assert tuner.memory.regimes[-1]["greedy_share"] == 1.0  # the greedy workload is kept


def test_a_change_dates_its_first_request_by_the_run_of_the_new_kind():
    watch = SamplingWatch()
    for _ in range(30):
        watch.observe(1, 0)
    watch.observe(0, 1)
    watch.observe(1, 0)  # one greedy request among the new ones: the run starts after it
    assert [watch.observe(0, 1) for _ in range(5)][-1] == "down"
    assert watch.count == 37 and watch.onset == 33


def test_a_change_the_tokens_showed_first_keeps_what_was_measured_since(tmp_path):
    """Run 18 of tuner_phases: the throughput left the code regime on prose's second request,
    prose was measured (0.19x at 11), and the sampling changed three requests later. Leaving
    again there booked prose's numbers to code's share of greedy requests, and code, back,
    recalled them and was served off. Now the sampling change corrects the share of the
    regime the tokens left, and prose's numbers stay prose's."""
    tuner, events = make(tmp_path, min_steps=10_000)  # no decisions: watch the change alone
    tuner._remember(replace(tuner.memory, baseline_tps=50.0, measured={"11": PAYS}))
    tuner._seen = {"-:11": 0.98}
    for _ in range(40):  # code: greedy requests
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    for _ in range(2):  # prose's first requests
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    tuner._leave_regime(time.time())  # the throughput fell: what `contradicted` does
    assert tuner.memory.regimes[-1]["greedy_share"] < 1.0  # the share so far mixes both
    tuner._remember(replace(tuner.memory, measured={"11": LOSES}))
    tuner._seen = {"-:11": 0.03}
    for _ in range(3):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    assert [e[2].get("direction") for e in events] == ["down"]
    assert "the tokens showed first" in events[0][1]
    assert tuner.memory.measured == {"11": LOSES}  # prose's, kept as prose's
    assert [(r["greedy_share"], r["measured"]) for r in tuner.memory.regimes] == \
        [(1.0, {"11": PAYS})]
    for _ in range(30):  # the rest of prose
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    for _ in range(5):  # code again
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    assert events[-1][2]["action"] == "recall" and events[-1][2]["measured"] == {"11": 1.5}
    prose = [r for r in tuner.memory.regimes if r["greedy_share"] == 0.0]
    assert prose and prose[0]["measured"] == {"11": LOSES}


def test_a_drift_of_the_tokens_long_before_a_change_of_sampling_is_another_change(tmp_path):
    """Code, then structured output (also greedy: the tokens show it), then prose: the
    sampling change leaves the structured output's regime as before."""
    tuner, events = make(tmp_path, min_steps=10_000)
    tuner._remember(replace(tuner.memory, baseline_tps=50.0, measured={"11": PAYS}))
    tuner._seen = {"-:11": 0.98}
    for _ in range(20):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    tuner._leave_regime(time.time())
    tuner._remember(replace(tuner.memory, measured={"4": PAYS}))
    tuner._seen = {"-:4": 0.7}
    for _ in range(20):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    for _ in range(5):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    assert "drifted down (Page-Hinkley): re-evaluating" in events[-1][1]
    assert tuner.memory.measured == {}
    assert [r["measured"] for r in tuner.memory.regimes] == [{"11": PAYS}, {"4": PAYS}]


def test_a_change_the_tokens_showed_first_with_nothing_measured_since_recalls_a_kept_one(tmp_path):
    tuner, events = make(tmp_path, min_steps=10_000)
    code = remember([], {"-:12": 0.9}, tuner.variant, {"12": PAYS}, {}, now=1.0, greedy_share=1.0)
    tuner._remember(replace(tuner.memory, baseline_tps=50.0, regimes=code))
    for _ in range(40):  # prose
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(0, 1))
    for _ in range(2):  # code's first requests
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    tuner._leave_regime(time.time())  # the tokens showed it; nothing measured in prose
    for _ in range(3):
        tuner.observe(sample(0, 0, 0, 0), proxy_sampling=(1, 0))
    assert "the tokens showed first" in events[0][1]
    assert events[1][2]["action"] == "recall" and events[1][2]["measured"] == {"12": 1.5}
    assert tuner.memory.measured == {"12": PAYS}
