"""launcher: ray on a real local Ray cluster (tests/ray_cluster.py: a head and two workers,
real `ray start` processes on 127.0.0.1 with fake GPUs) and the real llama-server: targets
placed on the nodes the fleet file asks for, requests through specfleet's proxy, kill -9
of a server, the daemon killed with -9 and a new one adopting the actors, a model file
missing on the chosen node, and a worker node's raylet killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import (
    DaemonProcess,
    llama_target,
    runtime_pids,
    supervised_daemons,
    wait_for,
    write_fleet,
)
from tests.ray_cluster import RayCluster

pytestmark = pytest.mark.ray

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n"


def ray_fleet(tmp_path: Path, cluster: RayCluster, targets: dict[str, Any],
              **daemon: Any) -> Path:
    # One namespace per test: an actor a test leaves behind cannot be adopted by the next.
    namespace = f"t-{tmp_path.name}"[:60]
    return write_fleet(tmp_path, targets, ray={"address": cluster.address,
                                               "namespace": namespace},
                       stop_targets_on_exit=True, **daemon)


def ray_target(model: str, binary: str, nodes: list[str], **over: Any) -> dict[str, Any]:
    return llama_target(model, binary, **{
        "launcher": "ray", "gpus": [0], "ray": {"nodes": nodes},
        "health": {"interval": "0.5s", "timeout": "2s", "failures": 4,
                   "metrics_interval": "1s", "start_timeout": "120s"},
        **over})


def proxy_completion(fleet: Path, model: str) -> dict[str, Any]:
    listen = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    req = urllib.request.Request(f"http://{listen}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as resp:
        return json.loads(resp.read())


class RayDaemon(DaemonProcess):
    """The daemon with its working directory in the test's directory (see the missing-model
    test: a path under /proc/self/cwd exists for the daemon and not on the Ray nodes)."""

    def _spawn(self) -> subprocess.Popen[bytes]:
        from tests.conftest import REPO
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", str(self.fleet), "--json-logs"],
            stdout=subprocess.DEVNULL, stderr=self._stderr, stdin=subprocess.DEVNULL,
            cwd=self.fleet.parent, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture
def daemons(tmp_path: Path, ray_cluster: RayCluster) -> Iterator[Callable[[Path], DaemonProcess]]:
    # stop_targets_on_exit: the actors and their servers go too, which takes longer.
    try:
        yield from supervised_daemons(tmp_path, RayDaemon, stop_timeout=60)
    finally:
        # An actor a test left behind (its own teardown fails for it) would hold a node's
        # GPU for the next test on this module's cluster: that test would fail too.
        ray_cluster.end_actors()


def node_name(status: dict[str, Any]) -> str:
    return str(status.get("placement", {}).get("node", ""))


def test_two_speculating_targets_run_on_the_nodes_asked_for_and_serve_through_the_proxy(
        tmp_path, model, llama_server_bin, ray_cluster, daemons):
    fleet = ray_fleet(tmp_path, ray_cluster, {
        "ngram": ray_target(model, llama_server_bin, ["worker-a"],
                            speculation={"method": "ngram"}),
        "draft": ray_target(model, llama_server_bin, ["worker-b"], host="0.0.0.0",
                            speculation={"method": "draft", "draft": model,
                                         "length": {"start": 4}})})
    daemon = daemons(fleet)
    ngram = daemon.wait_state("ngram", "ready", 180)
    draft = daemon.wait_state("draft", "ready", 180)
    # Named as the fleet file names them, with the address Ray registered them under (Ray
    # 2.60 registers this machine's own address even with --node-ip-address 127.0.0.1).
    address = ngram["placement"]["address"]
    assert node_name(ngram).startswith(f"worker-a ({address}, node ")
    assert node_name(draft).startswith(f"worker-b ({address}, node ")
    assert ngram["placement"]["node_id"] != draft["placement"]["node_id"]
    # Ray gave each actor the one fake GPU of its node, and the runtime got it.
    assert ngram["placement"]["node_gpus"] == "0" == draft["placement"]["node_gpus"]
    # A wildcard bind is reached at the node's address; the loopback bind as written.
    ports = {n: t["port"] for n, t in yaml.safe_load(fleet.read_text())["targets"].items()}
    assert draft["endpoint"] == f"http://{address}:{ports['draft']}"
    assert ngram["endpoint"] == f"http://127.0.0.1:{ports['ngram']}"
    for name in ("ngram", "draft"):
        out = proxy_completion(fleet, name)
        assert out["choices"][0]["text"]
    wait_for(lambda: daemon.target("draft")["metrics"].get("drafts"), 30,
             "the draft target's acceptance counters, read at the node's address")
    # The runtime's output came back into the target's log file.
    log = (tmp_path / "state" / "logs" / "draft.log").read_text()
    assert "starting on node worker-b" in log and "listening on http://0.0.0.0:" in log
    record = json.loads((tmp_path / "state" / "runs" / "ngram.json").read_text())
    assert record["launcher"] == "ray" and record["gpus"]["node"] == node_name(ngram)  # placement
    # The daemon's LiteLLM export names the node each target runs on, and the file's wish.
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    with urllib.request.urlopen(f"http://{api}/v1/litellm", timeout=30) as resp:
        exported = {m["model_name"]: m["model_info"] for m in json.loads(resp.read())["model_list"]}
    assert exported["ngram"]["node"] == node_name(ngram)
    assert exported["draft"]["node"] == node_name(draft)
    assert exported["ngram"]["ray_nodes"] == ["worker-a"]

    pid = ngram["pid"]
    os.kill(pid, signal.SIGKILL)  # the server, not the actor: specfleet restarts it
    again = wait_for(lambda: (t := daemon.target("ngram")).get("state") == "ready"
                     and t.get("pid") != pid and t, 120, "the restart after kill -9")
    assert again["restarts"] == 1
    assert node_name(again) == node_name(ngram)  # the same node
    backoff = next(e for e in daemon.events("ngram") if e.get("new") == "backoff")
    assert "SIGKILL" in backoff["reason"]
    assert proxy_completion(fleet, "ngram")["choices"][0]["text"]


def test_a_new_daemon_adopts_the_actors_after_kill_9_without_a_second_server(
        tmp_path, model, llama_server_bin, ray_cluster, daemons):
    fleet = ray_fleet(tmp_path, ray_cluster, {
        "chat": ray_target(model, llama_server_bin, ["worker-b", "worker-a"],
                           speculation={"method": "ngram"})})
    first = daemons(fleet)
    before = first.wait_state("chat", "ready", 180)
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    assert runtime_pids(str(tmp_path)) == [before["pid"]]  # the actor kept it running

    second = daemons(fleet)
    adopted = second.wait_state("chat", "ready", 120)
    assert adopted["pid"] == before["pid"] and adopted["restarts"] == 0
    assert node_name(adopted) == node_name(before)
    reasons = [e["reason"] for e in second.events("chat") if e["kind"] == "state"]
    assert any("adopted specfleet/chat on node worker-b" in r for r in reasons), reasons
    assert runtime_pids(str(tmp_path)) == [before["pid"]]  # no second server
    log = (tmp_path / "state" / "logs" / "chat.log").read_text()
    assert "couldn't bind" not in log
    assert proxy_completion(fleet, "chat")["choices"][0]["text"]
    # SIGTERM is the daemon's, not Ray's crash handler's (which wrote a stack trace and,
    # on a loaded box, ended the daemon with SIGABRT before it stopped the actor).
    assert second.stop(60) == 0
    assert "SIGTERM received" not in second.log(), second.log()
    assert runtime_pids(str(tmp_path)) == []  # stop_targets_on_exit


def test_a_model_file_missing_on_the_chosen_node_fails_with_the_node_named(
        tmp_path, model, llama_server_bin, ray_cluster, daemons):
    # /proc/self/cwd is the daemon's directory for the daemon (the model is there) and the
    # Ray worker's own for the node: one file, present here and missing on the node.
    local = Path(model).name
    fleet = ray_fleet(tmp_path, ray_cluster, {
        "chat": ray_target(f"/proc/self/cwd/{local}", llama_server_bin, ["worker-a"])})
    daemon = daemons(fleet)
    failed = daemon.wait_state("chat", "failed", 120)
    reason = failed["last_event"]["reason"]
    assert reason.startswith("on node worker-a ("), reason
    assert f"model file /proc/self/cwd/{local} does not exist" in reason
    assert runtime_pids(str(tmp_path)) == []


def test_a_dead_worker_node_moves_the_target_to_the_other_node(
        tmp_path, model, llama_server_bin, ray_cluster, daemons):
    fleet = ray_fleet(tmp_path, ray_cluster, {
        "chat": ray_target(model, llama_server_bin, ["worker-a", "worker-b"],
                           speculation={"method": "ngram"}),
        "pinned": ray_target(model, llama_server_bin, ["worker-a"], gpus="none")})
    daemon = daemons(fleet)
    before = daemon.wait_state("chat", "ready", 180)
    assert node_name(before).startswith("worker-a ")
    daemon.wait_state("pinned", "ready", 180)
    raylet = ray_cluster.raylet_of("worker-a")
    raylet.kill()
    try:
        # Pinned to the dead node: not restarted onto it while Ray still lists it alive
        # ("The actor died unexpectedly"), but failed once Ray says it is gone.
        failed = daemon.wait_state("pinned", "failed", 180)
        assert "no node fits: worker-a (" in failed["last_event"]["reason"]
        assert ") is gone" in failed["last_event"]["reason"], failed["last_event"]
        after = wait_for(lambda: (t := daemon.target("chat")).get("state") == "ready"
                         and node_name(t).startswith("worker-b ") and t, 180,
                         "the target back on worker-b")
        assert after["pid"] != before["pid"]
        moved = [e["reason"] for e in daemon.events("chat") if e["kind"] == "placement"]
        assert moved and moved[-1].startswith(f"moved from node {node_name(before)} to node "
                                              "worker-b ("), moved
        assert proxy_completion(fleet, "chat")["choices"][0]["text"]
        assert runtime_pids(str(tmp_path)) == [after["pid"]]  # the old one died with its node
    finally:
        ray_cluster.start_worker("worker-a")  # for any test after this one


def test_sigterm_leaves_the_actor_running_and_a_removed_targets_actor_is_stopped_at_start(
        tmp_path, model, llama_server_bin, ray_cluster, daemons):
    fleet = ray_fleet(tmp_path, ray_cluster, {
        "old": ray_target(model, llama_server_bin, ["worker-a", "worker-b"])})
    doc = yaml.safe_load(fleet.read_text())
    doc["daemon"]["stop_targets_on_exit"] = False
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    first = daemons(fleet)
    pid = first.wait_state("old", "ready", 180)["pid"]
    assert first.stop() == 0
    assert "SIGTERM received" not in first.log(), first.log()
    assert first.events("old")[-1]["new"] == "detached"
    assert runtime_pids(str(tmp_path)) == [pid]  # the actor kept its server

    doc["daemon"]["stop_targets_on_exit"] = True
    doc["targets"] = {"new": ray_target(model, llama_server_bin, ["worker-b", "worker-a"])}
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    second = daemons(fleet)
    new_pid = second.wait_state("new", "ready", 180)["pid"]
    removed = [e["reason"] for e in second.events("-")
               if e["reason"].startswith("stopped the Ray actor")]
    assert removed == ["stopped the Ray actor specfleet/old: its target is no longer in the "
                       "fleet file (or no longer uses launcher: ray)"]
    wait_for(lambda: runtime_pids(str(tmp_path)) == [new_pid], 30, "the old server to go")


def test_address_local_starts_a_private_cluster_that_goes_with_the_daemon(
        tmp_path, model, llama_server_bin, ray_cluster, daemons, monkeypatch):
    # The test cluster runs meanwhile: `local` must not join it. HOME in the test's directory:
    # a local Ray 2.60 cluster turns token auth on and writes its token to ~/.ray/auth_token.
    real_token = Path.home() / ".ray" / "auth_token"
    had_token = real_token.exists()
    monkeypatch.setenv("HOME", str(tmp_path))
    fleet = write_fleet(tmp_path, {
        "chat": llama_target(model, llama_server_bin, launcher="ray",
                             speculation={"method": "ngram"},
                             health={"interval": "0.5s", "start_timeout": "120s"})},
        ray={"address": "local", "namespace": "local-test"}, stop_targets_on_exit=True)

    def started() -> tuple[DaemonProcess, list[psutil.Process]]:
        daemon = daemons(fleet)
        server = psutil.Process(daemon.wait_state("chat", "ready", 180)["pid"])
        # On a cluster made of the daemon's own children, not on the test cluster.
        assert daemon.proc.pid in [p.pid for p in server.parents()]
        assert not set(server.parents()) & set(ray_cluster.remember())
        assert proxy_completion(fleet, "chat")["choices"][0]["text"]
        return daemon, psutil.Process(daemon.proc.pid).children(recursive=True)

    def gone(family: list[psutil.Process]) -> bool:
        return not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    first, family = started()
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    # The raylet's agents outlive a daemon killed with -9; the next daemon's sweep ends them.
    second, second_family = started()
    wait_for(lambda: gone(family), 10, "the first private cluster to be gone")
    assert "ray local cluster" in second.log()
    assert second.stop() == 0
    wait_for(lambda: gone(second_family), 30, "the second private cluster to go with its daemon")
    assert real_token.exists() == had_token


def test_a_ray_head_that_is_down_holds_up_neither_the_api_nor_other_targets(
        tmp_path, model, llama_server_bin, daemons):
    # Issue 30: ray.init retried the head for 71-160 s before the API listened, the process
    # target waiting with it, nothing said; and the daemon's exit would wait on it too.
    from tests.conftest import free_port
    from tests.ray_cluster import ray_available
    if not ray_available():  # without it the Ray target fails at once: nothing to reach
        pytest.skip("ray is not installed: pip install 'specfleet[ray]'")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    fleet = write_fleet(tmp_path, {
        "local": llama_target(model, llama_server_bin),
        "remote": ray_target(model, llama_server_bin, ["worker-a"])},
        ray={"address": address, "namespace": "down"}, stop_targets_on_exit=True)
    daemon = daemons(fleet)
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]

    def healthz() -> bool:
        try:
            with urllib.request.urlopen(f"http://{api}/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False
    wait_for(healthz, 30, "the API to answer")
    daemon.wait_state("local", "ready", timeout=60)
    assert daemon.target("remote")["state"] in ("starting", "waiting"), daemon.target("remote")
    said = [e["reason"] for e in daemon.events("-")]
    assert f"connecting to the Ray cluster at daemon.ray.address {address}; targets on Ray " \
           "start once it answers" in said, said
    # The Ray target waits and tries again (its owner answers commands meanwhile).
    waiting = wait_for(lambda: [e for e in daemon.events("remote") if e.get("new") == "waiting"],
                       60, "the Ray target's first try to fail")[0]
    assert waiting["data"]["failure"] == "unreachable", waiting
    assert f"the Ray cluster at daemon.ray.address {address} does not answer" in waiting["reason"]
    assert daemon.stop(timeout=30) == 0, daemon.log()  # killed after 30 s otherwise
