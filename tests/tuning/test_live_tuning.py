"""Tuning against the real llama-server: decisions are made on measured numbers and applied."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request

import psutil
import yaml

from supervisor.config.loader import load_fleet
from supervisor.plugin.registry import default_registry
from supervisor.tuning.acceptance import CLASS_HEADER
from supervisor.tuning.controller import Observation, TuningController
from supervisor.tuning.cost import Interval, StepCost
from supervisor.tuning.store import fingerprint, runtime_key
from tests.conftest import llama_target, plain_step_measured, wait_for, write_fleet

CODE = ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
        "def volume(w, h, d):\n    return w * h * d\n\n"
        "# Repeat the three functions above exactly, then stop.\n")

FAST_TUNING = {"min_tokens": 200, "min_steps": 30, "cooldown": "0s", "max_wait": "5s",
               "reprobe": "1h"}


def complete(endpoint: str, prompt: str, n: int = 64) -> dict | None:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0,
                       "cache_prompt": False}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/completion", body),
                                    timeout=120) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None  # the server is restarting for a tuning decision


def drive(daemon, name: str, until, prompt: str, limit: int = 120) -> None:
    """Send requests one at a time until `until()` holds (bounded in requests and time)."""
    sent, deadline = 0, time.monotonic() + 600
    while sent < limit and time.monotonic() < deadline:
        if until():
            return
        target = daemon.target(name)
        if target.get("state") == "ready":
            sent += 1
            if complete(target["endpoint"], prompt) is not None:
                continue
        time.sleep(0.3)
    raise AssertionError(f"{name}: condition not reached after {sent} requests; events:\n"
                         + "\n".join(json.dumps(e) for e in daemon.events(name)[-12:]))


def tuning_events(daemon, name: str) -> list[dict]:
    """The target's tuning events, each with its `data` ({} where it carried none)."""
    return [{**e, "data": e.get("data") or {}} for e in daemon.events(name)
            if e["kind"] == "tuning"]


def test_a_self_draft_is_calibrated_predicted_slower_than_no_speculation_and_turned_off(
        tmp_path, model, llama_server_bin, start_daemon):
    target = llama_target(model, llama_server_bin, tuning=dict(FAST_TUNING), speculation={
        "method": "draft", "draft": model, "length": {"start": 4, "min": 1, "max": 8}})
    daemon = start_daemon(write_fleet(tmp_path, {"selfdraft": target}))
    daemon.wait_state("selfdraft", "ready")
    plain_step_measured(daemon, "selfdraft")
    drive(daemon, "selfdraft",
          lambda: any(e["data"].get("new") == "off" for e in tuning_events(daemon, "selfdraft")),
          "The history of the Roman Empire begins with")
    events = tuning_events(daemon, "selfdraft")
    said = [e["reason"] for e in events]
    # The calibration's plain step comes first: from then on a setting that loses to off
    # may be turned off before its drafted steps are measured too.
    measured = next(i for i, r in enumerate(said) if r.startswith(
        ("calibrating: a plain step", "calibrated: a plain step")))
    off = next(i for i, e in enumerate(events) if e["data"].get("new") == "off")
    assert measured < off, said  # no decision before the cost was measured
    predicted = events[off]["data"]["predicted"]
    # A draft as large as the target: every setting the decision weighed (the running
    # length, before the lengths are calibrated; every length after) predicted slower than
    # off, although the draft is accepted almost always.
    assert all(p["mid"] < 1.0 for name, p in predicted.items() if name != "off"), predicted
    assert "below off" in events[off]["reason"]

    ready = daemon.wait_state("selfdraft", "ready")
    wait_for(lambda: daemon.target("selfdraft")["pid"] != ready["pid"]
             or "--spec-type" not in psutil.Process(ready["pid"]).cmdline(), 30, "restart")
    pid = daemon.wait_state("selfdraft", "ready")["pid"]
    assert "--spec-type" not in psutil.Process(pid).cmdline()
    assert daemon.target("selfdraft")["speculation"]["enabled"] is False
    # The calibration may go on after that (another class may gain from a length): its
    # server is the daemon's own child, and nothing is left once the daemon stops.
    def servers() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"])
                if llama_server_bin in " ".join(p.info["cmdline"] or [])]

    def daemons_child(p: psutil.Process) -> bool:
        try:
            return p.ppid() == daemon.proc.pid
        except psutil.NoSuchProcess:  # a calibration server that just ended
            return True

    running = servers()
    assert pid in [p.pid for p in running]
    assert all(daemons_child(p) for p in running), running
    assert daemon.stop() == 0
    wait_for(lambda: not servers(), 10, "no llama-server left")


def test_a_retune_restarts_with_the_new_setting_and_survives_a_daemon_restart(
        tmp_path, model, llama_server_bin, start_daemon):
    # ngram-mod on repeated code: no synthetic acceptance for n-gram drafts, so its cost is
    # learnt from serving; the first decision is another length or speculation off. Either
    # way the server must restart with it, and a new daemon must start with it.
    target = llama_target(model, llama_server_bin, tuning={**FAST_TUNING, "min_gain": "0%"},
                          speculation={"method": "ngram", "variant": "mod",
                                       "length": {"start": 4, "min": 2, "max": 64}})
    fleet = write_fleet(tmp_path, {"coder": target})
    daemon = start_daemon(fleet)
    daemon.wait_state("coder", "ready")

    def changed() -> dict | None:
        return next((e for e in tuning_events(daemon, "coder")
                     if e["data"].get("new") not in (None, "n=4")), None)

    drive(daemon, "coder", changed, CODE, limit=200)
    decision = changed()["data"]
    assert decision["old"] == "n=4" and decision["predicted"]["n=4"]["mid"] > 0
    off = decision["new"] == "off"
    expected = None if off else int(decision["new"][2:])

    def running_length(d) -> int | bool | None:
        t = d.target("coder")
        if t.get("state") != "ready":
            return False
        cmd = psutil.Process(t["pid"]).cmdline()
        return int(cmd[cmd.index("--spec-ngram-mod-n-max") + 1]) if "--spec-type" in cmd else None

    wait_for(lambda: running_length(daemon) == expected, 60, "the server to run the new setting")
    state_dir = daemon.state_dir
    assert daemon.stop() == 0
    kept = json.loads((state_dir / "tuning.json").read_text())["coder"]
    assert kept["setting"] == (0 if off else expected)

    again = start_daemon(fleet)
    again.wait_state("coder", "ready")
    assert running_length(again) == expected
    assert again.target("coder")["speculation"]["enabled"] is (not off)
    again.signal(signal.SIGTERM)


def test_changing_the_speculation_config_discards_what_was_learnt(tmp_path):
    from supervisor.tuning.store import TunerMemory, TuningStore

    store = TuningStore(tmp_path / "tuning.json")
    store.save("t", TunerMemory("cfg-a", setting=12, calibration={"cost": {}}, learnt={"x": 1}))
    assert store.load("t", "cfg-a").setting == 12
    fresh = store.load("t", "cfg-b")
    assert fresh == TunerMemory("cfg-b")


def test_a_request_of_a_class_known_to_lose_is_served_with_speculation_off(
        tmp_path, model, llama_server_bin, start_daemon):
    target = llama_target(model, llama_server_bin, tuning=dict(FAST_TUNING), speculation={
        "method": "draft", "draft": model, "length": {"start": 4, "min": 1, "max": 8}})
    fleet = write_fleet(tmp_path, {"selfdraft": target})
    # What an earlier run learnt: what a step costs, and that class "story" accepts little
    # (at every length it would be slower than off). The daemon starts at n=4.
    registry = default_registry()
    loaded = load_fleet(fleet, registry.check_target).fleet.targets["selfdraft"]
    runtime = asyncio.run(registry.backend_for(loaded).preflight())
    cost = StepCost(plain=0.04, step=0.08, per_draft=0.01, per_accepted=0.0)
    learnt = TuningController(lengths=list(range(1, 9)), current=4)
    learnt.calibrated({"1": cost})
    for _ in range(3):
        pos = [200 * 0.2 * 0.3 ** i for i in range(4)]
        acc = sum(pos) / 200
        learnt.observe(Observation(
            Interval(200 * cost.drafted(4, acc), int(200 * (1 + acc)), 200, 800, 200 * acc,
                     speculating=True), 4, 1, pos, {"story": 200 * (1 + acc)}))
    assert learnt.classes["story"].steps >= FAST_TUNING["min_steps"]
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "tuning.json").write_text(json.dumps({"selfdraft": {
        "fingerprint": fingerprint(loaded), "setting": 4,
        "runtime_key": runtime_key(loaded, runtime),
        "calibration": {"costs": {"1": cost.to_dict()}, "shaped": True},
        "learnt": learnt.state()}}))
    daemon = start_daemon(fleet)
    first = daemon.wait_state("selfdraft", "ready")
    assert "--spec-type" in psutil.Process(first["pid"]).cmdline()

    proxy = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    body = {"model": "selfdraft", "prompt": "Once upon a time", "max_tokens": 24,
            "temperature": 0.8}
    req = urllib.request.Request(f"http://{proxy}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", CLASS_HEADER: "story"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        answer = json.loads(resp.read())
    # Held until a server without speculation served it: not one token was drafted.
    assert answer["timings"].get("draft_n", 0) == 0, answer["timings"]
    assert answer["choices"][0]["text"]
    reasons = [e["reason"] for e in tuning_events(daemon, "selfdraft")]
    assert any(r.startswith("a request of class 'story' arrives: every setting's best case is "
                            "below off") for r in reasons), reasons
    now = daemon.wait_state("selfdraft", "ready")
    assert now["pid"] != first["pid"] and "--spec-type" not in psutil.Process(now["pid"]).cmdline()
    assert daemon.target("selfdraft")["speculation"]["enabled"] is False
