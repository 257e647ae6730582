"""Why the tuner runs what it runs (tuning/evidence.py), and the labels every view shares
(supervision/labels.py): pure functions, fed plain values."""

from __future__ import annotations

from dataclasses import replace

from supervisor.cli import statusview
from supervisor.plugin.backend import RuntimeInfo
from supervisor.supervision import labels
from supervisor.tuning import evidence
from supervisor.tuning.store import TunerMemory, TuningStore
from tests.test_autotune import make, sample

PAID = {"speedup": 1.42, "draft_fraction": 1.0, "mean_draft_size": 8.0,
        "accepted_per_draft": 5.0, "by_load": {"1": 1.5}}


def test_a_decision_applied_is_logged_with_its_reason_and_numbers_then_its_restart_is_timed(
        tmp_path):
    tuner, events = make(tmp_path, max_wait=3600)
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner.observe(sample(10, 7.0, 100, 1.0, busy=1))
    tuner.observe(sample(50, 7.0, 500, 5.0, busy=1))
    reason = tuner.observe(sample(51, 7.0, 510, 5.1, busy=0))
    assert reason is not None
    tuner.apply_pending()
    tuner.restarted(3.25, beside=False)
    tuner.restarted(9.0, beside=False)  # a later start (a crash) is not the decision's cost
    kept = TuningStore(tmp_path / "tuning.json").load("t", tuner.memory.fingerprint)
    [entry] = kept.decisions
    assert entry["action"] == "baseline" and entry["reason"] == reason
    assert entry["old_length"] == 8 and entry["speculation"] is False
    assert entry["restart"] == {"ready_after_s": 3.25, "beside": False, "unserved_s": 3.25}
    assert events[-1][2]["action"] == "baseline"


def test_a_restart_beside_the_old_server_costs_no_service_and_the_log_keeps_the_last_twenty():
    memory = TunerMemory("f")
    for i in range(25):
        memory = evidence.logged(memory, f"decision {i}", {"action": "retune", "speedup": 1.1,
                                                           "note": "not a number"}, float(i))
    memory = evidence.booked(memory, 4.0, beside=True)
    assert len(memory.decisions) == evidence.KEPT and memory.decisions[0]["reason"] == "decision 5"
    assert memory.decisions[-1]["numbers"] == {"speedup": 1.1}
    assert memory.decisions[-1]["restart"]["unserved_s"] == 0.0
    assert evidence.booked(memory, 9.0, beside=False) == memory  # booked once


def test_why_names_every_length_and_variant_measured_against_speculation_off():
    memory = TunerMemory("f", length=16, baseline_tps=40.0,
                         measured={"16": PAID, "4": {**PAID, "speedup": 1.1}},
                         variants={"mod": {"length": 16, "speedup": 1.42},
                                   "simple": {"length": 48, "speedup": 0.9}})
    view = evidence.why(memory, length=16, variant="mod", start=8)
    assert [(p["variant"], p["length"], p["speedup"]) for p in view["measured"]] == [
        ("mod", 4, 1.1), ("mod", 16, 1.42), ("simple", 48, 0.9)]
    assert view["running"]["length"] == 16 and view["start"] == 8
    assert view["baseline"]["tokens_per_second"] == 40.0
    assert view["summary"].startswith("mod n=16 measured 1.42x speculation off")
    off = evidence.why(replace(memory, phase="off"), length=16, variant="mod", start=8)
    assert off["running"]["speculation"] is False and off["summary"].startswith(
        "speculation is off")
    assert "no baseline" in evidence.why(TunerMemory("f"), length=8, variant=None,
                                         start=8)["summary"]


def test_status_target_prints_the_same_evidence():
    memory = evidence.logged(TunerMemory("f", length=16, baseline_tps=40.0, measured={"16": PAID}),
                             "retune 8 -> 16", {"action": "retune", "speedup": 1.42}, 100.0)
    view = {"enabled": True, **evidence.why(evidence.booked(memory, 2.0, beside=True),
                                            length=16, variant="mod", start=8)}
    text = statusview.render_target({"name": "t", "state": "ready"}, None, view, now=160.0)
    assert "why this setting: mod n=16 measured 1.42x" in text
    assert "mod n=16 1.42x (speculation off = 1.00x, 40.0 tok/s)" in text
    assert "1m00s ago  retune: retune 8 -> 16 [speedup 1.42]; new server ready after 2.0 s" \
        in text


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
