"""Why the tuner runs what it runs (tuning/evidence.py), and the labels every view shares
(supervision/labels.py): pure functions, fed plain values."""

from __future__ import annotations

from supervisor.cli import statusview
from supervisor.plugin.backend import RuntimeInfo
from supervisor.supervision import labels
from supervisor.tuning import evidence
from supervisor.tuning.store import TunerMemory, TuningStore
from tests.tuning.test_autotune import CHEAP, Counters, calibrate, make


def decided(tmp_path):
    """A tuner that calibrated, served code-like text at n=4 and switched."""
    tuner, _ = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    calibrate(tuner, CHEAP)
    c = Counters(CHEAP)
    assert tuner.observe(c.serve(4, 0.95, 200, busy=0),
                         proxy_classes={"greedy /completion": 380}) is not None
    tuner.apply_pending()
    return tuner


def test_a_decision_is_logged_with_its_prediction_then_its_restart_is_timed(tmp_path):
    tuner = decided(tmp_path)
    d = tuner.memory.decisions[-1]
    assert d["old"] == "n=4" and d["new"] == f"n={tuner.draft_length}" and d["restart"] is None
    assert d["predicted"][d["new"]]["mid"] > 1 and d["switch_cost_s"] == 30.0
    tuner.restarted(2.5, beside=False)
    kept = TuningStore(tmp_path / "tuning.json").load("t", tuner.memory.fingerprint)
    assert kept.decisions[-1]["restart"] == {"ready_after_s": 2.5, "beside": False,
                                             "unserved_s": 2.5}
    assert evidence.cost(kept.decisions[-1]["restart"]) == "restart in place: 2.5 s unserved"


def test_a_restart_beside_the_old_server_costs_no_service_and_the_log_keeps_the_last_twenty():
    memory = TunerMemory("f")
    for i in range(25):
        memory = evidence.booked(evidence.logged(memory, f"d{i}", {"action": "switch"},
                                                 float(i)), 1.0, beside=True)
    assert len(memory.decisions) == 20 and memory.decisions[0]["reason"] == "d5"
    assert evidence.cost(memory.decisions[-1]["restart"]).endswith("0 s unserved")


def test_why_shows_the_cost_each_class_and_every_setting_predicted_with_the_running_marked(
        tmp_path):
    tuner = decided(tmp_path)
    why = evidence.why(tuner.view(), tuner.memory)
    assert why["cost"] == {"plain_ms": 40.0, "step_ms": 60.0, "per_draft_ms": 4.0,
                           "per_accepted_ms": 0.0, "calibrated": True}
    assert [c["name"] for c in why["classes"]] == ["greedy /completion"]
    running = [p for p in why["predicted"] if p["running"]]
    assert [p["setting"] for p in running] == [f"n={tuner.draft_length}"]
    assert {p["setting"] for p in why["predicted"]} >= {"off", "n=1", "n=16"}
    assert why["summary"].startswith(f"runs n={tuner.draft_length}, predicted ")
    assert "greedy /completion 100 %" in why["summary"]
    words = why["decisions"][-1]["expectation"]
    assert words.startswith("expected +") and "minute(s) of this mix, a restart costs 30 s" \
        in words


def test_before_the_calibration_why_says_what_it_waits_for(tmp_path):
    tuner, _ = make(tmp_path)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    why = evidence.why(tuner.view(), tuner.memory)
    assert why["cost"] is None and why["predicted"] == [] and why["decisions"] == []
    assert why["waiting_for"].startswith("the calibration")
    assert "length.start" not in why["summary"]


def test_status_target_prints_the_same_model(tmp_path):
    tuner = decided(tmp_path)
    tuner.restarted(2.0, beside=True)
    why = {"enabled": True, **evidence.why(tuner.view(), tuner.memory)}
    now = tuner.memory.decisions[-1]["time"] + 60
    text = statusview.render_target({"name": "t", "state": "ready"}, None, why, now=now)
    assert f"why this setting: runs n={tuner.draft_length}, predicted" in text
    assert "a step costs 40.0 ms plain; drafted 60.0 ms + 4.00 ms a drafted token" in text
    assert "class        greedy /completion: 100 % of the mix" in text
    assert f"n={tuner.draft_length} " in text and "(running)" in text
    assert f"1m00s ago  n=4 -> n={tuner.draft_length}: " in text
    assert "new server ready after 2.0 s beside the old one" in text


def test_labels_name_the_variant_and_length_and_show_nothing_measured_when_not_serving():
    t = {"name": "t", "state": "ready", "pid": 7, "started_at": 1000.0, "restarts": 1,
         "model": "/models/m.gguf",
         "restarts_by_reason": {"crash": 1, "start_timeout": 2},
         "speculation": {"method": "ngram", "variant": None, "enabled": True,
                         "draft_length": None},
         "shown": {"acceptance_rate": 0.8812, "mean_accepted_length": 3.104,
                   "tokens_per_second": 41.49, "draft_length": 64},
         "resources": {"rss_bytes": 300 << 20}}
    shown = labels.display(t, now=1098.0)
    assert shown == {"speculation": "ngram-mod n=64 (default)", "uptime": "1m38s",
                     "acceptance": "88.1%", "accepted_length": "3.10 tokens/step",
                     "speed": "41.5 tok/s", "memory": "RSS 300.0 MiB",
                     "restarts": "1 after failures (1 crash, 2 start timeout)",
                     "last_event": "-", "source": "/models/m.gguf"}
    loading = labels.display({**t, "state": "loading"}, now=1098.0)
    assert loading["acceptance"] == loading["speed"] == loading["memory"] == "-"


def test_the_model_label_names_a_modelkit_by_reference_digest_and_pull_progress():
    plain = {"model": "/models/m.gguf"}
    assert labels.source(plain) == "/models/m.gguf"
    kit = {"reference": "reg.example/lab/m:v1", "manifest_digest": "sha256:" + "ab" * 32}
    assert labels.source({"model": "/c/m.gguf", "modelkit": kit}) == \
        "reg.example/lab/m:v1 @ sha256:abababababab"
    pulling = {**kit, "pull": {"done": 3 << 20, "total": 12 << 20}}
    assert labels.source({"modelkit": pulling}).endswith(
        ", pulling 3.0 MiB of 12.0 MiB (25%)")
    assert labels.source({"modelkit": {**kit, "offline": "registry down"}}).endswith(
        "from the cache (registry not reached)")
    assert labels.display({"modelkit": kit, "state": "starting"})["source"].startswith("reg.")


def test_a_class_never_seen_learnt_at_a_short_length_says_what_it_risked():
    data = {"action": "switch", "expected_gain": 0.0, "mix": {"poetry": 1.0},
            "learning": "poetry", "risk_s": 22.4, "switch_cost_s": 5.0}
    memory = evidence.logged(TunerMemory("f"), "a request of class 'poetry' arrives: …",
                             data, 0.0)
    assert evidence.expectation(memory.decisions[-1]) == (
        "learning what class 'poetry' accepts where it risks least: at the old setting up "
        "to 22 s more if it accepts nothing, a restart costs 5 s")


def test_serving_off_to_measure_a_load_says_so():
    data = {"action": "explore", "expected_gain": 0.0, "mix": {"code": 1.0},
            "measuring": "8+", "switch_cost_s": 5.0}
    memory = evidence.logged(TunerMemory("f"), "what a step costs … never measured", data, 0.0)
    assert evidence.expectation(memory.decisions[-1]) == (
        "measuring what a step costs without speculation at 8+ requests running, a restart "
        "costs 5 s")
