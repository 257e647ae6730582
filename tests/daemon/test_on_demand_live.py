"""On-demand loading with the real llama-server (docs/on-demand.md): memory declared
(`daemon.gpu.memory`) so that the VRAM planner applies on this CPU machine, sized from the
planner's own estimate so that exactly two of the test's targets fit at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.config.loader import load_fleet
from supervisor.plugin.registry import default_registry
from supervisor.tuning.store import fingerprint, runtime_key
from tests.conftest import (
    FAST_RESTART,
    DaemonProcess,
    in_flight,
    llama_target,
    runtime_pids,
    wait_for,
    write_fleet,
)

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n"


def fleet_of(tmp_path: Path, targets: dict[str, dict[str, Any]], fit: int = 2,
             **daemon: Any) -> Path:
    """A fleet whose declared GPU memory holds `fit` of its targets (the first's estimate)."""
    fleet = write_fleet(tmp_path, targets, **daemon)
    registry = default_registry()
    first = load_fleet(fleet, registry.check_target).fleet.targets[next(iter(targets))]
    need = registry.backend_for(first).memory_estimate(on_gpu=True).total
    doc = yaml.safe_load(fleet.read_text())
    doc["daemon"]["gpu"] = {"memory": [need * fit + need // 2], "headroom": 0}
    doc["daemon"]["proxy"]["hold"] = "120s"
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    return fleet


def on_demand(model: str, binary: str, **over: Any) -> dict[str, Any]:
    return llama_target(model, binary, **{"start": "on_demand", "min_residency": "1s", **over})


def proxy(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]


def complete(fleet: Path, model: str, max_tokens: int = 16, stream: bool = False) -> str:
    """A completion through the proxy: the generated text (streamed: every event's text,
    after checking that the stream ended with [DONE])."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}
    req = urllib.request.Request(f"{proxy(fleet)}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        raw = resp.read().decode()
    if not stream:
        return str(json.loads(raw)["choices"][0]["text"])
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", raw[-300:]
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


def in_background(fn: Any, *args: Any, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kw)
        except Exception as exc:
            out["error"] = exc
        out["ended"] = time.time()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def loaded(daemon: DaemonProcess) -> set[str]:
    return {t["name"] for t in daemon.status().get("targets", [])
            if t["state"] not in ("unloaded", "stopped", "failed")}


def unload_reasons(daemon: DaemonProcess, name: str) -> list[str]:
    """Why it was unloaded after running (not the `unloaded` it starts in)."""
    return [e["reason"] for e in daemon.events(name)
            if e["kind"] == "state" and e.get("new") == "unloaded" and e.get("old") != "stopped"]


def test_the_third_target_evicts_the_least_recently_used_idle_one_and_every_request_succeeds(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = fleet_of(tmp_path, {"a": on_demand(model, llama_server_bin),
                                "b": on_demand(model, llama_server_bin,
                                               speculation={"method": "ngram"}),
                                "c": on_demand(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    for name in "abc":
        daemon.wait_state(name, "unloaded", 30)
    assert runtime_pids(str(tmp_path)) == []
    assert complete(fleet, "a") and complete(fleet, "b")  # cold starts, both fit
    b_loaded = time.time()
    assert loaded(daemon) == {"a", "b"}
    # A long request keeps `a` busy (and recent); `b` is the least recently used idle one.
    busy, result = in_background(complete, fleet, "a", 160, stream=True)
    wait_for(lambda: in_flight(fleet, "a") == 1, 30, "a busy")
    # Past its 1 s min_residency, b is the one to go; inside it, b would be kept and busy a
    # (past its own) drained instead, as docs/on-demand.md says: on a fast machine c was
    # asked for 0.36 s after b loaded, and a was evicted.
    time.sleep(max(0.0, b_loaded + 1.5 - time.time()))
    assert complete(fleet, "c")
    busy.join(300)
    assert "error" not in result and result["value"]  # never cut
    assert loaded(daemon) == {"a", "c"}
    [evicted] = unload_reasons(daemon, "b")
    assert evicted.startswith("evicted to load c (") and "short on GPU 0" in evicted
    assert daemon.target("a")["on_demand"]["unloads"] == {}
    c = daemon.target("c")
    assert c["on_demand"]["loads"] == 1 and c["on_demand"]["cold_start_s"] > 0
    assert c["restarts"] == 0 and c["restarts_by_reason"] == {}
    b = daemon.target("b")
    assert b["on_demand"]["unloads"] == {"evicted": 1} and b["restarts_by_reason"] == {}
    assert len(runtime_pids(str(tmp_path))) == 2
    with urllib.request.urlopen(f"http://{yaml.safe_load(fleet.read_text())['daemon']['api']}"
                                "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert 'specfleet_target_unloads_total{backend="llamacpp",reason="evicted",target="b"} 1.0' \
        in metrics
    assert 'specfleet_target_loads_total{backend="llamacpp",target="c"} 1.0' in metrics
    assert 'specfleet_target_state{backend="llamacpp",state="unloaded",target="b"} 1.0' in metrics


def test_a_busy_target_is_drained_before_it_is_evicted(tmp_path, model, llama_server_bin,
                                                       start_daemon):
    # The drain is bounded by x's restart.stop_grace: long enough here for the stream to
    # end on any machine (at 5 s, the other tests' bound, a slower CI machine cut the
    # 160-token stream a few tokens before its end).
    slow_stop = {**FAST_RESTART, "stop_grace": "120s"}
    fleet = fleet_of(tmp_path, {"x": on_demand(model, llama_server_bin, restart=slow_stop),
                                "y": on_demand(model, llama_server_bin)}, fit=1)
    daemon = start_daemon(fleet)
    daemon.wait_state("x", "unloaded", 30)
    assert complete(fleet, "x")
    busy, result = in_background(complete, fleet, "x", 160, stream=True)
    wait_for(lambda: in_flight(fleet, "x") == 1, 30, "x busy")
    asked = time.time()
    assert complete(fleet, "y")  # waited for x's request to finish, then for y's load
    busy.join(300)
    assert "error" not in result and result["value"]
    stopping = next(e for e in daemon.events("x") if e.get("new") == "stopping")
    assert stopping["time"] >= asked
    # Drained: x's server stopped only after its request was answered in full.
    unloaded = next(e for e in daemon.events("x") if e.get("new") == "unloaded"
                    and e.get("old") == "stopping")
    assert unloaded["time"] >= result["ended"] - 0.1  # (two clocks read in two threads)
    assert daemon.target("y")["on_demand"]["cold_start_s"] > 0
    assert loaded(daemon) == {"y"}


def test_idle_unload_unloads_and_the_next_request_reloads_with_the_tuned_length(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"coder": llama_target(
        model, llama_server_bin, idle_unload="2s",
        speculation={"method": "ngram", "length": {"start": 3}})})
    # What an earlier run of the tuner learned: length 7 (the file says start at 3).
    registry = default_registry()
    target = load_fleet(fleet, registry.check_target).fleet.targets["coder"]
    runtime = asyncio.run(registry.backend_for(target).preflight())
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "tuning.json").write_text(json.dumps({"coder": {
        "fingerprint": fingerprint(target), "setting": 7,
        "runtime_key": runtime_key(target, runtime)}}))
    daemon = start_daemon(fleet)
    first = daemon.wait_state("coder", "ready", 60)  # start: always, then idle_unload
    assert first["speculation"]["draft_length"] == 7
    unloaded = daemon.wait_state("coder", "unloaded", 30)
    assert unload_reasons(daemon, "coder")[0].startswith("idle for ")
    assert unloaded["on_demand"]["unloads"] == {"idle": 1} and runtime_pids(str(tmp_path)) == []
    assert complete(fleet, "coder")
    again = daemon.target("coder")
    assert again["state"] == "ready" and again["pid"] != first["pid"]
    assert again["speculation"]["draft_length"] == 7
    record = json.loads((tmp_path / "state" / "runs" / "coder.json").read_text())
    argv = record["argv"]
    assert argv[argv.index("--spec-ngram-mod-n-max") + 1] == "7"
    kept = json.loads((tmp_path / "state" / "tuning.json").read_text())["coder"]
    assert kept["setting"] == 7 and kept["runtime_key"] == runtime_key(target, runtime)


def test_a_pinned_target_is_never_evicted(tmp_path, model, llama_server_bin, start_daemon):
    fleet = fleet_of(tmp_path, {"pinned": on_demand(model, llama_server_bin, evictable=False),
                                "p": on_demand(model, llama_server_bin),
                                "q": on_demand(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("pinned", "unloaded", 30)
    assert complete(fleet, "pinned")
    pid = daemon.target("pinned")["pid"]
    for name in ("p", "q", "p"):  # pinned is the least recently used each time
        assert complete(fleet, name)
        assert loaded(daemon) == {"pinned", name}
    assert daemon.target("pinned")["pid"] == pid
    assert unload_reasons(daemon, "pinned") == []
    assert len(unload_reasons(daemon, "p")) == 1 and len(unload_reasons(daemon, "q")) == 1


def test_alternating_clients_swap_at_most_once_per_minimum_residency(
        tmp_path, model, llama_server_bin, start_daemon):
    residency = 6.0
    fleet = fleet_of(tmp_path, {n: on_demand(model, llama_server_bin,
                                             min_residency=f"{residency:g}s")
                                for n in ("left", "right")}, fit=1)
    daemon = start_daemon(fleet)
    daemon.wait_state("left", "unloaded", 30)
    errors: list[object] = []
    served: list[tuple[str, float]] = []
    began = time.monotonic()

    def client(name: str) -> None:
        while time.monotonic() - began < 4 * residency:
            try:
                complete(fleet, name, max_tokens=4)
                served.append((name, time.monotonic()))
            except urllib.error.HTTPError as exc:
                errors.append(f"{exc}: {exc.read().decode(errors='replace')}")
                return
            except (urllib.error.URLError, OSError, AssertionError) as exc:
                errors.append(exc)
                return
    threads = [threading.Thread(target=client, args=(n,)) for n in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - began
    assert errors == []
    swaps = [r for n in ("left", "right") for r in unload_reasons(daemon, n)]
    # Each swap needs the other to have run for a residency: at most one per residency.
    assert 1 <= len(swaps) <= elapsed / residency + 1, (len(swaps), elapsed)
    times = sorted(e["time"] for n in ("left", "right") for e in daemon.events(n)
                   if e["kind"] == "state" and e.get("new") == "unloaded"
                   and e.get("old") != "stopped")
    assert all(b - a >= residency - 0.5 for a, b in itertools.pairwise(times))
    assert {n for n, _ in served} == {"left", "right"}
    waits = [e for n in ("left", "right") for e in daemon.events(n)
             if e["kind"] == "load" and "min_residency" in e["reason"]]
    assert waits  # the other side waited for the residency, visibly


def test_a_group_swaps_its_members_without_a_vram_plan_and_an_api_restart_loads(
        tmp_path, model, llama_server_bin, start_daemon):
    # No daemon.gpu.memory and no GPU: nothing is planned, but a group still swaps.
    fleet = write_fleet(tmp_path, {n: on_demand(model, llama_server_bin, group="big")
                                   for n in ("one", "two")})
    daemon = start_daemon(fleet)
    daemon.wait_state("one", "unloaded", 30)
    with urllib.request.urlopen(f"{proxy(fleet)}/v1/models", timeout=30) as resp:
        models = {m["id"]: m["ready"] for m in json.loads(resp.read())["data"]}
    assert models == {"one": False, "two": False}
    assert complete(fleet, "one") and complete(fleet, "two")
    assert loaded(daemon) == {"two"}
    assert unload_reasons(daemon, "one") == ["evicted to load two (group big)"]
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    req = urllib.request.Request(f"http://{api}/v1/targets/one/restart", b"", method="POST")
    with urllib.request.urlopen(req, timeout=30):
        pass
    daemon.wait_state("one", "ready", 60)  # the restart of an unloaded target is a load
    assert loaded(daemon) == {"one"} and daemon.target("one")["restarts_by_reason"] == {}


def test_a_model_truncated_while_unloaded_is_refused_before_anything_is_evicted_for_it(
        tmp_path, model, llama_server_bin, start_daemon):
    """A model file replaced by a copy that did not finish (its header whole, its tensors
    cut): the load is refused at once with why, and the loaded target stays."""
    whole = Path(model).read_bytes()
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(whole)
    fleet = fleet_of(tmp_path, {"a": on_demand(model, llama_server_bin),
                                "b": on_demand(str(copy), llama_server_bin)}, fit=1)
    daemon = start_daemon(fleet)
    daemon.wait_state("b", "unloaded", 30)
    assert complete(fleet, "a") and loaded(daemon) == {"a"}
    copy.write_bytes(whole[: len(whole) * 2 // 3])
    began = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as refused:
        complete(fleet, "b")
    said = refused.value.read().decode()
    assert refused.value.code == 503 and "is truncated" in said, said
    assert time.monotonic() - began < 30  # not after a load attempt and its crash
    assert loaded(daemon) == {"a"} and unload_reasons(daemon, "a") == []
    assert daemon.target("b")["state"] == "unloaded"
