"""AutoTuner, the glue between one target's metrics and its restarts, with plain samples."""

from __future__ import annotations

import time
from dataclasses import replace

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.plugin.backend import MetricsSample, RuntimeInfo
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.store import BASELINE, TunerMemory, TuningStore


def make(tmp_path, variant: str | None = None,
         **tuning) -> tuple[AutoTuner, list[tuple[str, str, dict]]]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    target = Target(name="t", model=str(model), port=1, tuning={"min_steps": 20, "min_tokens": 100,
                                                                  "cooldown": 0, **tuning},
                    speculation={"method": "ngram", "variant": variant,
                                 "length": {"start": 8, "max": 16}})
    events: list[tuple[str, str, dict]] = []
    tuner = AutoTuner(target, LlamaCppBackend(target), TuningStore(tmp_path / "tuning.json"),
                      lambda kind, reason, **data: events.append((kind, reason, data)))
    return tuner, events


def sample(drafts: int, accepted_per_step: float, tokens: int, seconds: float,
           start: float = 1.0, busy: int = 0) -> MetricsSample:
    per_pos = tuple(round(drafts * min(1.0, accepted_per_step / 8)) for _ in range(8))
    return MetricsSample(process_start=start, drafts=drafts, draft_tokens=drafts * 8,
                         accepted_tokens=sum(per_pos), accepted_per_position=per_pos,
                         tokens_predicted=tokens, tokens_predicted_seconds=seconds,
                         requests_processing=busy)


def test_a_changed_model_or_runtime_invalidates_the_baseline(tmp_path):
    tuner, events = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner._remember(replace(tuner.memory, baseline_tps=50.0))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert tuner.memory.baseline_tps == 50.0 and events == []
    tuner.runtime_started(RuntimeInfo("/bin/true", "v2"))
    assert tuner.memory.baseline_tps is None
    assert events[0][1].startswith("model file or runtime changed")


def test_a_decision_waits_for_an_idle_server_then_is_applied_and_persisted(tmp_path):
    tuner, events = make(tmp_path, max_wait=3600)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert tuner.observe(sample(10, 7.0, 100, 1.0, busy=1)) is None  # ngram-mod warming up
    assert tuner.observe(sample(50, 7.0, 500, 5.0, busy=1)) is None  # baseline due, server busy
    reason = tuner.observe(sample(51, 7.0, 510, 5.1, busy=0))
    assert reason is not None and "measuring throughput without speculation" in reason
    tuner.apply_pending()
    assert not tuner.speculation_on and events[-1][2]["action"] == "baseline"
    kept = TuningStore(tmp_path / "tuning.json").load("t", tuner.memory.fingerprint)
    assert kept.phase == "baseline"


def test_sustained_acceptance_drift_is_reported_and_clears_old_measurements(tmp_path):
    tuner, events = make(tmp_path, min_steps=10_000)  # no decisions: watch drift alone
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner._remember(TunerMemory(tuner.memory.fingerprint, baseline_tps=50.0,
                                baseline_key=tuner.memory.baseline_key,
                                measured={"8": {"speedup": 1.5, "draft_fraction": 1.0,
                                                "mean_draft_size": 8.0,
                                                "accepted_per_draft": 7.0}}))
    drafts = tokens = 0
    for i in range(40):
        per_step = 7.0 if i < 20 else 2.0
        drafts += 10
        tokens += round(10 * (1 + per_step))
        tuner.observe(sample(drafts, per_step, tokens, tokens / 60, busy=1))
    drift = [e for e in events if "drifted down" in e[1]]
    assert len(drift) == 1
    assert tuner.memory.measured == {}


def test_a_server_restart_does_not_look_like_negative_acceptance(tmp_path):
    tuner, _ = make(tmp_path, min_steps=10_000)
    tuner.observe(sample(100, 7.0, 800, 10.0, start=1.0, busy=1))
    tuner.observe(sample(10, 7.0, 80, 1.0, start=2.0, busy=1))  # counters restarted
    stats = tuner.window.stats()
    assert stats.drafts == 110 and stats.tokens == 880


def test_a_started_ngram_mod_is_judged_only_once_it_has_served_min_tokens(tmp_path):
    # Its hash pool starts empty at each start (tests/test_drafter_memory.py measures it).
    tuner, _ = make(tmp_path)  # ngram, llama.cpp's default variant: mod
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert tuner.view()["warming_tokens_left"] == 100
    tuner.observe(sample(5, 7.0, 60, 1.0, busy=1))
    assert tuner.window.stats().tokens == 0 and tuner.view()["warming_tokens_left"] == 40
    tuner.observe(sample(10, 7.0, 120, 2.0, busy=1))
    assert tuner.window.stats().tokens == 0 and tuner.view()["warming_tokens_left"] == 0
    tuner.observe(sample(15, 7.0, 180, 3.0, busy=1))
    assert tuner.window.stats().tokens == 60 and tuner.by_load.stats()
    # A crash restart starts it cold again.
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.observe(sample(5, 7.0, 60, 1.0, start=2.0, busy=1))
    assert tuner.window.stats().tokens == 0


def test_a_drafter_that_does_not_learn_or_no_drafter_is_judged_from_the_start(tmp_path):
    tuner, _ = make(tmp_path, variant="simple")
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.observe(sample(5, 7.0, 60, 1.0, busy=1))
    assert tuner.view()["warming_tokens_left"] == 0 and tuner.window.stats().tokens == 60
    (tmp_path / "off").mkdir()
    tuner, _ = make(tmp_path / "off")  # mod, but the baseline runs without speculation
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner._remember(replace(tuner.memory, phase=BASELINE))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    assert not tuner.speculation_on and tuner.view()["warming_tokens_left"] == 0


def test_a_workload_that_stops_drafting_is_a_drift_though_its_acceptance_never_moves(tmp_path):
    # Code, then prose where n-gram finds no match: no draft, so no acceptance to watch,
    # and a window mixing both would judge the setting by the prose's "off" speed.
    tuner, events = make(tmp_path, min_steps=10_000)
    drafts = tokens = 0
    for i in range(20):
        drafts += 10 if i < 10 else 0
        tokens += 80
        tuner.observe(sample(drafts, 7.0, tokens, tokens / 60, busy=1))
    drift = [e for e in events if "drifted" in e[1]]
    assert len(drift) == 1, drift
    assert drift[0][1].startswith("the share of steps with a draft drifted down")
    assert drift[0][2]["acceptance_rate"] is None and drift[0][2]["draft_fraction"] == 0.0


def test_a_decision_is_applied_on_a_busy_server_when_the_restart_costs_no_service(tmp_path):
    tuner, _ = make(tmp_path, max_wait=3600)
    tuner.restart_is_free = lambda: True  # the new server starts beside the old one
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.observe(sample(10, 7.0, 100, 1.0, busy=1))  # ngram-mod warming up
    reason = tuner.observe(sample(50, 7.0, 500, 5.0, busy=4))  # busy all along
    assert reason is not None and "measuring throughput without speculation" in reason


def test_a_restart_in_place_waits_no_longer_than_its_cost_is_worth(tmp_path):
    clock = [0.0]
    tuner, _ = make(tmp_path, max_wait=3600, min_gain=0.05)
    tuner.clock = lambda: clock[0]
    tuner.restart_seconds = 4.0  # the last start took 4 s to become ready
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.observe(sample(10, 7.0, 100, 1.0, busy=1))
    assert tuner.observe(sample(50, 7.0, 500, 5.0, busy=3)) is None  # pending, server busy
    view = tuner.view()
    # No predicted gain for a baseline: valued at min_gain, 4 s / 5 % = 80 s.
    assert view["pending"] and "80s" in view["waiting_for"]
    clock[0] = 79.0
    assert tuner.observe(sample(51, 7.0, 510, 5.1, busy=3)) is None
    clock[0] = 80.5
    assert tuner.observe(sample(52, 7.0, 520, 5.2, busy=3)) is not None  # busy, applied anyway


def test_a_setting_losing_where_its_workload_paid_is_a_drift_judged_without_the_old_numbers(
        tmp_path):
    tuner, events = make(tmp_path, variant="simple", cooldown=3600)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    paid = {"16": {"speedup": 1.3, "draft_fraction": 0.9, "mean_draft_size": 8.0,
                   "accepted_per_draft": 6.0}}
    tuner._remember(replace(tuner.memory, baseline_tps=100.0, measured=paid,
                            last_change=time.time()))
    tuner.observe(sample(1, 0.0, 10, 0.1))
    reason = tuner.observe(sample(31, 0.2, 70, 3.1))  # 20 tok/s: 0.2x, in the cool-down
    said = [r for kind, r, _ in events if kind == "tuning" and "change of workload" in r]
    assert said and "x the baseline at length 8, where this workload measured up to 1.30x" in said[0]
    assert reason is not None and "does not pay" in reason  # not a retune to the old 16
    assert "16" not in tuner.memory.measured  # left with the workload it described


def test_while_an_old_server_computes_on_the_same_cores_nothing_is_evidence(tmp_path):
    # steady_load run 4: a baseline measured while the old server still ran 8 requests on
    # the same 2 cores booked 7.7 tok/s at one client (off alone did 50) and turned a
    # paying setting off. While the old one finishes, what the new one does is dropped.
    tuner, _ = make(tmp_path, variant="simple")  # no warm-up: judged from the start
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.sharing_cores = True
    assert tuner.observe(sample(10, 7.0, 100, 1.0, busy=1)) is None
    assert tuner.observe(sample(60, 7.0, 600, 20.0, busy=1)) is None  # would be a decision
    assert tuner.window.stats().tokens == 0 and not tuner.by_load.stats()
    tuner.sharing_cores = False  # the old server stopped
    tuner.observe(sample(70, 7.0, 700, 21.0, busy=1))
    assert tuner.window.stats().tokens == 100  # counted from the last sample, not before
