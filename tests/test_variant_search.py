"""The n-gram variant search on top of the length search (tuning/variants.py): which
variants are searched, when the tuner switches, what it records, what the runtime is then
started with; the fleet-file checks; and live, a real llama-server switched by the tuner."""

from __future__ import annotations

import json
from dataclasses import replace

import psutil
import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target, Tuning
from supervisor.plugin.backend import RuntimeInfo
from supervisor.plugin.registry import default_registry
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.decisions import Decision
from supervisor.tuning.store import OFF, SPECULATING, TunerMemory
from supervisor.tuning.variants import allowed_variants, search
from tests.conftest import llama_target, write_fleet

RUNTIME = ("mod", "simple", "map-k", "map-k4v")
SETTINGS = Tuning(off_margin=0.03)


@pytest.mark.parametrize(("configured", "start", "expected"), [
    (None, "mod", ()),
    ("auto", None, RUNTIME),
    ("auto", "simple", ("simple", "mod", "map-k", "map-k4v")),
    (("map-k", "simple"), "simple", ("simple", "map-k")),
    (("mod",), "mod", ()),  # one variant: nothing to search
])
def test_the_searched_variants_start_with_the_configured_one(configured, start, expected):
    assert allowed_variants(configured, start, RUNTIME) == expected


def decision(action: str, speedup: float, length: int = 16, **memory) -> Decision:
    return Decision(action, TunerMemory("f", length=length, **memory), "length layer",
                    {"old_length": length, "measured_speedup": speedup})


def test_a_settled_variant_is_recorded_and_the_next_untried_one_started():
    d = search(decision("keep", 1.68), "mod", ("mod", "simple"), SETTINGS, now=5.0)
    assert d.action == "variant"
    assert d.memory.variant == "simple" and d.memory.length is None  # its configured start
    assert d.memory.variants == {"mod": {"length": 16, "speedup": 1.68}}
    assert d.memory.measured == {} and d.memory.last_change == 5.0
    assert d.data["old_variant"] == "mod" and d.data["new_variant"] == "simple"
    assert "mod settled at length 16 (1.68x); trying variant simple" in d.reason


def test_once_all_are_measured_the_best_runs_at_its_own_length():
    tried = {"mod": {"length": 16, "speedup": 1.68}}
    d = search(decision("keep", 1.90, length=24, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), SETTINGS, 9.0)
    assert d.action == "keep" and d.memory.variants["simple"]["speedup"] == 1.90
    d = search(decision("keep", 1.50, length=24, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), SETTINGS, 9.0)
    assert d.action == "variant" and d.memory.variant == "mod" and d.memory.length == 16
    assert "running the best, mod" in d.reason


def test_a_variant_within_min_gain_of_the_best_keeps_running():
    # Measured again, simple is 3.6 % behind mod's earlier number: within noise, no restart.
    tried = {"mod": {"length": 24, "speedup": 2.32}}
    d = search(decision("keep", 2.24, length=48, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), Tuning(off_margin=0.03, min_gain=0.05), 9.0)
    assert d.action == "keep" and d.memory.variants["simple"]["speedup"] == 2.24
    d = search(decision("keep", 2.10, length=48, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), Tuning(off_margin=0.03, min_gain=0.05), 9.0)
    assert d.action == "variant" and d.memory.variant == "mod"


def test_a_variant_that_does_not_pay_hands_over_to_the_next_and_none_paying_is_off():
    d = search(decision("disable", 0.95, phase=OFF), "mod", ("mod", "simple"), SETTINGS, 1.0)
    assert d.action == "variant" and d.memory.phase == SPECULATING
    assert "mod does not pay" in d.reason
    tried = {"mod": {"length": 16, "speedup": 0.95}}
    d = search(decision("disable", 0.99, phase=OFF, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), SETTINGS, 2.0)
    assert d.action == "disable" and d.memory.phase == OFF and set(d.memory.variants) == {
        "mod", "simple"}


def test_variants_the_fleet_file_no_longer_allows_are_neither_run_nor_chosen(tmp_path):
    tried = {"map-k": {"length": 8, "speedup": 3.0}, "mod": {"length": 16, "speedup": 1.5}}
    d = search(decision("keep", 1.6, variants=tried, variant="simple"), "simple",
               ("mod", "simple"), SETTINGS, 1.0)
    assert d.action == "keep" and set(d.memory.variants) == {"mod", "simple"}
    target = Target(name="t", model=str(tmp_path / "m.gguf"), port=1,
                    speculation={"method": "ngram", "variants": ["mod", "simple"]})
    tuner = AutoTuner(target, LlamaCppBackend(target), None, lambda *a, **k: None)
    tuner._remember(replace(tuner.memory, variant="map-k"))
    assert tuner.variant is None  # the configured one (llama.cpp's default, mod)


def test_other_decisions_and_no_search_pass_through():
    for action in ("retune", "explore", "baseline", "restore"):
        d = decision(action, 1.5)
        assert search(d, "mod", ("mod", "simple"), SETTINGS, 0.0) is d
    d = decision("keep", 1.5)
    assert search(d, "mod", (), SETTINGS, 0.0) is d and search(None, "mod", RUNTIME, SETTINGS,
                                                                0.0) is None


def test_the_tuner_starts_the_runtime_with_the_variant_it_switched_to(tmp_path):
    target = Target(name="t", model=str(tmp_path / "m.gguf"), port=1,
                    speculation={"method": "ngram", "variant": "mod", "variants": "auto",
                                 "length": {"start": 16}})
    events: list = []
    tuner = AutoTuner(target, LlamaCppBackend(target), None,
                      lambda kind, reason, **data: events.append(data))
    tuner.runtime_started(RuntimeInfo("/bin/true", "v1"))
    tuner._pending = search(decision("keep", 1.6), "mod", tuner.variants_allowed, SETTINGS, 1.0)
    tuner.apply_pending()
    assert tuner.variant == "simple" and events[-1]["action"] == "variant"
    argv = tuner.launch_backend().launch_spec(tuner.draft_length).argv
    assert argv[argv.index("--spec-type") + 1] == "ngram-simple"
    # length.start (16) is mod's n-max; simple starts at llama.cpp's own size-m (48).
    assert tuner.draft_length is None and "--spec-ngram-simple-size-m" not in argv
    assert tuner.bounds().current == 48
    assert tuner.view()["variant"] == "simple"
    tuner._remember(replace(tuner.memory, variant=None))
    assert tuner.variant == "mod"  # nothing tuned: the configured one


@pytest.mark.parametrize(("backend", "speculation", "message"), [
    ("vllm", {"method": "ngram", "variants": "auto"}, "has no n-gram variants"),
    ("llamacpp", {"method": "ngram", "variants": ["mod", "cache"]},
     "cache: not a variant the tuner can switch to"),
    ("llamacpp", {"method": "draft", "draft": "/d.gguf", "variants": "auto"},
     "variants applies to method ngram only"),
    ("llamacpp", {"method": "ngram", "variant": "simple", "variants": ["mod", "map-k"]},
     "does not include variant 'simple'"),
])
def test_the_fleet_file_is_checked(tmp_path, backend, speculation, message):
    from supervisor.config.loader import load_fleet
    from supervisor.errors import FleetFileError
    model = tmp_path / ("m" if backend == "vllm" else "m.gguf")
    model.mkdir() if backend == "vllm" else model.write_bytes(b"")
    fleet = write_fleet(tmp_path, {"t": {"backend": backend, "model": str(model), "port": 8000,
                                         "binary": "/bin/true", "speculation": speculation}})
    with pytest.raises(FleetFileError) as err:
        load_fleet(fleet, check_target=default_registry().check_target)
    assert message in str(err.value), str(err.value)
    assert "speculation.variants" in str(err.value)


@pytest.mark.live
def test_a_real_server_is_switched_to_another_variant_with_the_numbers(
        tmp_path, model, llama_server_bin, start_daemon):
    from tests.test_live_tuning import CODE, FAST_TUNING, drive, tuning_events
    target = llama_target(model, llama_server_bin, tuning={**FAST_TUNING, "min_gain": "50%"},
                          speculation={"method": "ngram", "variant": "mod",
                                       "variants": ["mod", "simple"],
                                       "length": {"start": 16, "min": 4, "max": 32}})
    daemon = start_daemon(write_fleet(tmp_path, {"t": target}))
    daemon.wait_state("t", "ready")

    def switched() -> dict | None:
        return next((e for e in tuning_events(daemon, "t")
                     if e["data"].get("action") == "variant"), None)

    drive(daemon, "t", switched, CODE, limit=200)
    event = switched()
    print(json.dumps([e["data"].get("action") for e in tuning_events(daemon, "t")]))
    assert event["data"]["old_variant"] == "mod" and event["data"]["new_variant"] == "simple"
    assert event["data"]["variants"]["mod"]["speedup"] > 0
    t = daemon.wait_state("t", "ready", 60)

    def running_variant() -> str | None:
        t = daemon.target("t")
        if t.get("state") != "ready":
            return None
        cmd = psutil.Process(t["pid"]).cmdline()
        return cmd[cmd.index("--spec-type") + 1] if "--spec-type" in cmd else "off"

    from tests.conftest import wait_for
    wait_for(lambda: running_variant() == "ngram-simple", 60, "the server on ngram-simple")
    assert daemon.target("t")["speculation"]["variant"] == "simple"
    assert t["tuning"]["variants_measured"]["mod"]["length"] >= 4
