"""The daemon against the real llama-server and the real gemma model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
import yaml

from tests.conftest import (
    REPO,
    llama_target,
    post_json,
    quickstart_fleet,
    runtime_pids,
    wait_for,
    write_fleet,
)

CODE_PROMPT = (
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "def mul(a, b):\n    return a * b\n\n# The same three functions again, unchanged:\n"
    "def add(a, b):\n"
)

NORMAL_START = [("stopped", "starting"), ("starting", "loading"), ("loading", "ready")]
CRASH_AND_RESTART = [("ready", "backoff"), ("backoff", "starting"), ("starting", "loading"),
                     ("loading", "ready")]


def crash_seen(transitions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The transitions with a health probe's "degraded" folded away where it came right
    before the exit: a probe in flight when the server is killed fails in the same instant
    the exit is reaped, and either may reach the owner first (a loaded Xeon once saw the
    probe first: ready -> degraded -> backoff). Any other degraded stays and fails the test."""
    out = []
    for old, new in transitions:
        if out and out[-1] == ("ready", "degraded") and old == "degraded" and new in (
                "backoff", "failed"):
            out[-1] = ("ready", new)
        else:
            out.append((old, new))
    return out


def test_quickstart_fleet_reaches_ready_and_the_ngram_target_counts_drafts(
        tmp_path, model, llama_server_bin, start_daemon):
    daemon = start_daemon(quickstart_fleet(tmp_path, model, llama_server_bin))
    names = [t for t in yaml.safe_load((tmp_path / "quickstart.yaml").read_text())["targets"]]
    ngram = next(n for n in names if "ngram" in n)
    for name in names:
        daemon.wait_state(name, "ready")
        assert daemon.transitions(name) == NORMAL_START

    result = post_json(f"{daemon.target(ngram)['endpoint']}/completion",
                       {"prompt": CODE_PROMPT, "n_predict": 96, "temperature": 0})
    assert result["content"].strip()
    assert result["timings"].get("draft_n", 0) > 0

    metrics = wait_for(lambda: daemon.target(ngram)["metrics"].get("drafts"), 30,
                       "the ngram target's draft counters")
    assert metrics > 0
    assert daemon.target(ngram)["metrics"]["draft_tokens"] >= result["timings"]["draft_n"]

    status = subprocess.run(
        [sys.executable, "-m", "supervisor", "status", "--state-dir", str(daemon.state_dir)],
        capture_output=True, text=True, cwd=REPO, check=False)
    assert status.returncode == 0, status.stderr
    for name in names:
        assert any(line.split()[:2] == [name, "ready"] for line in status.stdout.splitlines())


def test_kill_9_of_a_server_leads_back_to_ready_with_one_restart(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    first = daemon.wait_state("chat", "ready")
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: daemon.target("chat").get("restarts") == 1
             and daemon.target("chat")["state"] == "ready", 60, "the restart")
    again = daemon.target("chat")
    assert again["pid"] != first["pid"]
    assert crash_seen(daemon.transitions("chat")) == NORMAL_START + CRASH_AND_RESTART
    backoff = next(e for e in daemon.events("chat") if e.get("new") == "backoff")
    assert "SIGKILL" in backoff["reason"]


def test_the_fold_keeps_any_other_degraded():
    seen = [("ready", "degraded"), ("degraded", "backoff")]
    assert crash_seen(seen) == [("ready", "backoff")]
    assert crash_seen([("ready", "degraded"), ("degraded", "ready")]) == [
        ("ready", "degraded"), ("degraded", "ready")]


def test_crash_loop_gives_up_after_max_crashes_and_says_why(
        tmp_path, model, llama_server_bin, start_daemon):
    target = llama_target(model, llama_server_bin)
    target["restart"]["max_crashes"] = 2
    daemon = start_daemon(write_fleet(tmp_path, {"loopy": target}))
    pid = daemon.wait_state("loopy", "ready")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: daemon.target("loopy").get("state") == "ready"
             and daemon.target("loopy")["pid"] != pid, 60, "the first restart")
    os.kill(daemon.target("loopy")["pid"], signal.SIGKILL)
    failed = daemon.wait_state("loopy", "failed", 30)
    assert crash_seen(daemon.transitions("loopy")) == (
        NORMAL_START + CRASH_AND_RESTART + [("ready", "failed")])
    assert "2 crashes within 10m" in failed["last_event"]["reason"]
    assert failed["pid"] is None


def test_a_stopped_server_is_detected_as_hung_and_replaced(
        tmp_path, model, llama_server_bin, start_daemon):
    daemon = start_daemon(write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)}))
    hung = daemon.wait_state("chat", "ready")["pid"]
    os.kill(hung, signal.SIGSTOP)
    wait_for(lambda: daemon.target("chat").get("state") == "ready"
             and daemon.target("chat")["pid"] != hung, 60, "a replacement server")
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
    reasons = [e["reason"] for e in daemon.events("chat") if e.get("new") == "backoff"]
    assert len(reasons) == 1 and "hung" in reasons[0]
    assert ("ready", "degraded") in daemon.transitions("chat")


def test_a_bad_model_ends_failed_with_llama_servers_message_and_the_rest_stays_ready(
        tmp_path, model, llama_server_bin, start_daemon):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF this is not a model" * 100)
    daemon = start_daemon(write_fleet(tmp_path, {
        "good": llama_target(model, llama_server_bin),
        "broken": llama_target(str(bad), llama_server_bin),
    }))
    failed = daemon.wait_state("broken", "failed", 60)
    assert "exiting due to model loading error" in failed["failure_output"]
    assert "could not load the model" in failed["last_event"]["reason"]
    assert daemon.transitions("broken") == [("stopped", "starting"), ("starting", "loading"),
                                            ("loading", "failed")]
    daemon.wait_state("good", "ready")
    time.sleep(1)
    assert daemon.target("good")["state"] == "ready"
    shown = subprocess.run(
        [sys.executable, "-m", "supervisor", "status", "--state-dir", str(daemon.state_dir)],
        capture_output=True, text=True, cwd=REPO, check=False).stdout
    assert "exiting due to model loading error" in shown


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_llama_server_survives_the_daemon(sig, tmp_path, model, llama_server_bin,
                                             start_daemon):
    daemon = start_daemon(write_fleet(tmp_path, {
        "one": llama_target(model, llama_server_bin),
        "two": llama_target(model, llama_server_bin, speculation={"method": "ngram"}),
    }))
    serving = {daemon.wait_state("one", "ready")["pid"], daemon.wait_state("two", "ready")["pid"]}
    # A third llama-server may be running: the tuner's calibration beside a serving target.
    # It is the daemon's child too, so it must not survive either.
    assert serving <= set(runtime_pids(str(tmp_path)))
    daemon.signal(sig)
    daemon.proc.wait(30)
    wait_for(lambda: not runtime_pids(str(tmp_path)), 10, "every llama-server to exit")
    if sig == signal.SIGTERM:
        assert daemon.proc.returncode == 0
        assert daemon.transitions("two")[-2:] == [("ready", "stopping"), ("stopping", "stopped")]


def test_sighup_restarts_only_the_changed_target_and_a_broken_file_changes_nothing(
        tmp_path, model, llama_server_bin, start_daemon):
    targets = {"steady": llama_target(model, llama_server_bin),
               "changing": llama_target(model, llama_server_bin)}
    fleet = write_fleet(tmp_path, targets)
    daemon = start_daemon(fleet)
    steady_pid = daemon.wait_state("steady", "ready")["pid"]
    changing_pid = daemon.wait_state("changing", "ready")["pid"]

    doc = yaml.safe_load(fleet.read_text())
    doc["targets"]["changing"]["speculation"] = {"method": "ngram", "length": {"start": 16}}
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: daemon.target("changing").get("state") == "ready"
             and daemon.target("changing")["pid"] != changing_pid, 60, "the changed target")
    assert daemon.target("steady")["pid"] == steady_pid
    assert daemon.transitions("steady") == NORMAL_START
    assert daemon.target("changing")["speculation"]["method"] == "ngram"
    reload_event = [e for e in daemon.events() if e["kind"] == "reload"][-1]
    assert reload_event["data"] == {"added": [], "removed": [], "changed": ["changing"],
                                   "retried": [], "waiting": []}

    new_pid = daemon.target("changing")["pid"]
    good_text = fleet.read_text()
    fleet.write_text(good_text.replace("port:", "prot:", 1) + "\n  oops: [\n")
    daemon.signal(signal.SIGHUP)
    rejected = wait_for(lambda: [e for e in daemon.events() if "rejected" in e["reason"]], 20,
                        "the reload to be rejected")
    assert "fleet.yaml:" in rejected[0]["detail"]
    time.sleep(1)
    assert daemon.target("steady")["pid"] == steady_pid
    assert daemon.target("changing")["pid"] == new_pid
    assert {t["state"] for t in daemon.status()["targets"]} == {"ready"}



def test_a_separate_draft_model_runs_and_its_acceptance_is_read(
        tmp_path, model, llama_server_bin, start_daemon):
    # examples/draft-model.yaml: the same GGUF serves as its own draft (llama-server -md).
    target = llama_target(model, llama_server_bin, speculation={
        "method": "draft", "draft": model, "length": {"start": 4}})
    daemon = start_daemon(write_fleet(tmp_path, {"self-draft": target}))
    ready = daemon.wait_state("self-draft", "ready")
    cmdline = psutil.Process(ready["pid"]).cmdline()
    assert cmdline[cmdline.index("--spec-type") + 1] == "draft-simple"
    assert cmdline[cmdline.index("--spec-draft-n-max") + 1] == "4"
    result = post_json(f"{ready['endpoint']}/completion",
                       {"prompt": "The capital of France is", "n_predict": 24, "temperature": 0})
    assert result["timings"]["draft_n"] > 0
    metrics = wait_for(lambda: daemon.target("self-draft")["metrics"].get("draft_tokens")
                       and daemon.target("self-draft")["metrics"], 30, "draft counters")
    # A model drafting for itself at temperature 0 agrees with itself almost always.
    assert metrics["accepted_tokens"] / metrics["draft_tokens"] > 0.5
    assert 0 < len(metrics["accepted_per_position"]) <= 4


def test_the_api_key_is_enforced_but_never_on_the_command_line_or_in_logs(
        tmp_path, model, llama_server_bin, start_daemon):
    secret = "sk-specfleet-test-7c1e9a"
    key_file = tmp_path / "api.key"
    key_file.write_text(secret + "\n")
    key_file.chmod(0o600)
    target = llama_target(model, llama_server_bin, api_key={"file": str(key_file)},
                          speculation={"method": "ngram"})
    daemon = start_daemon(write_fleet(tmp_path, {"locked": target}))
    ready = daemon.wait_state("locked", "ready")
    assert secret not in " ".join(psutil.Process(ready["pid"]).cmdline())

    url = f"{ready['endpoint']}/completion"
    body = json.dumps({"prompt": CODE_PROMPT, "n_predict": 32, "temperature": 0}).encode()
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(urllib.request.Request(url, body), timeout=60)
    assert denied.value.code == 401
    denied.value.close()
    authed = urllib.request.Request(url, body, {"Authorization": f"Bearer {secret}"})
    with urllib.request.urlopen(authed, timeout=120) as resp:
        assert json.loads(resp.read())["content"]
    # The daemon reads /metrics with the key, so acceptance is still visible.
    wait_for(lambda: daemon.target("locked")["metrics"].get("drafts"), 30, "metrics with auth")
    daemon.stop()
    for path in [daemon.stderr_path, daemon.state_dir / "events.jsonl",
                 daemon.state_dir / "status.json", *daemon.state_dir.glob("logs/*")]:
        assert secret not in path.read_text(errors="replace"), path
