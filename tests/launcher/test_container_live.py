"""launcher: container with real podman (and runc) and the real llama-server in an image
built here (tests/container_image.py): the quick-start pair as containers, crash and hang
recovery, adoption after a daemon killed with -9, cleanup of removed targets, a missing
image (docs/containers.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import (
    REPO,
    DaemonProcess,
    free_port,
    quickstart_fleet,
    wait_for,
    write_fleet,
)
from tests.container_image import (
    SANDBOX,
    containers_of,
    remove_containers_of,
)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[str]:
    """The test's state dir, which labels its containers; none may be left at the end."""
    state = str(tmp_path / "state")
    yield state
    left = remove_containers_of(state)
    assert not left, f"containers outlived the test: {left}"


def container_fleet(tmp_path: Path, model: str, image: str, **over: Any) -> Path:
    """examples/quickstart.yaml with launcher: container; the in-image llama-server found on
    the image's PATH (no `binary:`); the daemon stops its containers when it exits."""
    path = quickstart_fleet(tmp_path, model, "unused", launcher="container",
                            container={"image": image, **SANDBOX}, **over)
    doc = yaml.safe_load(path.read_text())
    del doc["defaults"]["binary"]
    doc["daemon"]["stop_targets_on_exit"] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def proxy_completion(fleet: Path, model: str) -> dict[str, Any]:
    listen = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    body = {"model": model, "prompt": "def add(a, b):\n    return", "max_tokens": 8,
            "temperature": 0}
    req = urllib.request.Request(f"http://{listen}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def failures(daemon: DaemonProcess, name: str) -> list[str]:
    """The failure kinds of the target's backoffs, in order."""
    return [e["data"]["failure"] for e in daemon.events(name)
            if e["kind"] == "state" and e.get("new") == "backoff"]


def in_container(pid: int) -> bool:
    """Whether a host pid runs under conmon (podman's container monitor), not the daemon."""
    try:
        return psutil.Process(pid).parent().name() == "conmon"
    except psutil.Error:
        return False


def test_the_quickstart_pair_runs_in_containers_and_serves_through_the_proxy(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = container_fleet(tmp_path, model, image)
    daemon = DaemonProcess(fleet)
    try:
        names = list(yaml.safe_load(fleet.read_text())["targets"])
        for name in names:
            ready = daemon.wait_state(name, "ready", timeout=120)
            assert in_container(ready["pid"]), ready
            assert ready["runtime"]["image"] == image
            assert ready["runtime"]["image_id"] and ready["runtime"]["binary"] == "llama-server"
            assert "version" in ready["runtime"]
        for name in names:
            assert proxy_completion(fleet, name)["choices"][0]["text"]
        rows = containers_of(owner)
        assert sorted(r["target"] for r in rows) == sorted(names), rows
        assert {r["state"] for r in rows} == {"running"}, rows
        # What ran, in the run record: the image and its id next to the model's hash.
        record = json.loads((daemon.state_dir / "runs" / f"{names[0]}.jsonl").read_text()
                            .splitlines()[-1])
        assert record["files"]["model"]["path"] == model
        assert record["launcher"] == "container"
        assert record["runtime"]["image"] == image and record["runtime"]["image_id"]
        assert record["runtime"]["image_digest"].startswith("sha256:"), record["runtime"]
        assert record["argv"][0] == "llama-server"
        # The ngram target's speculation flags reached the server in the container.
        ngram = next(n for n in names if yaml.safe_load(fleet.read_text())["targets"][n]
                     .get("speculation", {}).get("method") == "ngram")
        cmdline = " ".join(psutil.Process(daemon.target(ngram)["pid"]).cmdline())
        assert "--spec-type" in cmdline, cmdline
        # The output is followed: llama-server's own lines are in the target's log.
        log = Path(daemon.target(names[0])["log_file"]).read_text()
        assert "llama_server: listening on http://127.0.0.1" in log, log[-2000:]
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert containers_of(owner) == []  # stop_targets_on_exit: stopped and removed


def test_a_killed_server_is_restarted_and_a_hung_one_replaced(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = container_fleet(tmp_path, model, image)
    name = next(iter(yaml.safe_load(fleet.read_text())["targets"]))
    daemon = DaemonProcess(fleet)
    try:
        first = daemon.wait_state(name, "ready", timeout=120)["pid"]
        os.kill(first, signal.SIGKILL)
        second = wait_for(lambda: (t := daemon.target(name)).get("state") == "ready"
                          and t["pid"] != first and t["pid"], 90, "a new server after kill -9")
        assert failures(daemon, name) == ["crash"], daemon.events(name)[-6:]
        assert in_container(second)
        os.kill(second, signal.SIGSTOP)  # hung: alive, answers nothing
        third = wait_for(lambda: (t := daemon.target(name)).get("state") == "ready"
                         and t["pid"] not in (first, second) and t["pid"], 90,
                         "a new server after the hang")
        assert failures(daemon, name) == ["crash", "hang"], daemon.events(name)[-8:]
        assert not psutil.pid_exists(second) or psutil.Process(second).status() == "zombie"
        assert in_container(third)
        assert len([r for r in containers_of(owner) if r["target"] == name]) == 1
    finally:
        daemon.stop()


def test_after_a_daemon_kill_containers_are_adopted_replaced_or_removed(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = container_fleet(tmp_path, model, image)
    doc = yaml.safe_load(fleet.read_text())
    kept, changed = list(doc["targets"])
    doc["targets"]["gone"] = {**doc["targets"][kept], "port": free_port()}
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon = DaemonProcess(fleet)
    pids = {n: daemon.wait_state(n, "ready", timeout=120)["pid"] for n in doc["targets"]}
    daemon.proc.kill()  # kill -9: nothing is stopped
    daemon.stop()
    assert all(psutil.pid_exists(p) for p in pids.values())
    # While it was down: one target's command changed, one left the fleet file.
    del doc["targets"]["gone"]
    doc["targets"][changed]["args"] = [*doc["targets"][changed].get("args", []), "-n", "64"]
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    second = DaemonProcess(fleet)
    try:
        adopted = second.wait_state(kept, "ready", timeout=120)
        assert adopted["pid"] == pids[kept]  # the same server, not a second one
        assert any("adopted container" in e["reason"] for e in second.events(kept))
        replaced = second.wait_state(changed, "ready", timeout=120)
        assert replaced["pid"] != pids[changed]
        assert any("replaced" in e["reason"] for e in second.events(changed))
        assert not psutil.pid_exists(pids["gone"])
        assert any("removed the container specfleet-gone" in e["reason"]
                   for e in second.events("-")), second.events("-")
        rows = containers_of(owner)
        assert sorted(r["target"] for r in rows) == sorted([kept, changed]), rows
        assert proxy_completion(fleet, kept)["choices"]
    finally:
        second.stop()


def test_a_reload_that_removes_a_target_removes_its_container(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = container_fleet(tmp_path, model, image)
    doc = yaml.safe_load(fleet.read_text())
    kept, removed = list(doc["targets"])
    daemon = DaemonProcess(fleet)
    try:
        for name in (kept, removed):
            daemon.wait_state(name, "ready", timeout=120)
        del doc["targets"][removed]
        fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: [r["target"] for r in containers_of(owner)] == [kept], 60,
                 f"only {kept}'s container to remain")
        assert daemon.target(kept)["state"] == "ready"
    finally:
        daemon.stop()


def test_a_missing_image_fails_with_the_engines_own_message(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = write_fleet(tmp_path, {"nope": {
        "model": model, "port": free_port(), "launcher": "container",
        "container": {"image": "localhost/specfleet-no-such-image:1", **SANDBOX}}})
    daemon = DaemonProcess(fleet)
    try:
        failed = daemon.wait_state("nope", "failed", timeout=60)
        text = json.dumps(failed)
        assert "localhost/specfleet-no-such-image:1" in text and "image not known" in text, text
    finally:
        daemon.stop()


def test_a_command_missing_from_the_image_fails_with_the_engines_own_message(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    fleet = write_fleet(tmp_path, {"typo": {
        "model": model, "port": free_port(), "launcher": "container", "binary": "llama-servr",
        "container": {"image": image, **SANDBOX}}})
    daemon = DaemonProcess(fleet)
    try:
        failed = daemon.wait_state("typo", "failed", timeout=60)
        text = json.dumps(failed)
        assert f"llama-servr cannot run in {image}" in text and "not found" in text, text
    finally:
        daemon.stop()


def test_units_render_says_why_this_podman_gets_no_quadlet_unit(
        tmp_path: Path, model: str, image: str) -> None:
    fleet = container_fleet(tmp_path, model, image)
    out = subprocess.run([sys.executable, "-m", "supervisor", "units", "render", str(fleet),
                          "--dir", str(tmp_path / "units")], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
    written = sorted(p.name for p in (tmp_path / "units").iterdir())
    if tuple(int(x) for x in version.split()[-1].split(".")[:2]) < (4, 4):
        assert "has no Quadlet (it came in 4.4)" in out, out
        assert written == ["specfleet.service", "specfleet.socket"], written
    else:
        assert sum(n.endswith(".container") for n in written) == 2, written


def test_two_state_dirs_with_a_target_of_one_name_run_two_containers(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    # Two daemons on one machine, each with a target `same` (issue 30: the second's start
    # removed the first's container, named `specfleet-same` whatever the state dir).
    fleets = []
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        path = container_fleet(tmp_path / sub, model, image)
        doc = yaml.safe_load(path.read_text())
        first = next(iter(doc["targets"]))
        doc["targets"] = {"same": doc["targets"][first]}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        fleets.append(path)
    owners = [str(tmp_path / sub / "state") for sub in ("a", "b")]
    a = DaemonProcess(fleets[0])
    b = None
    try:
        pid_a = a.wait_state("same", "ready", timeout=120)["pid"]
        b = DaemonProcess(fleets[1])
        pid_b = b.wait_state("same", "ready", timeout=120)["pid"]
        for fleet in fleets:
            assert proxy_completion(fleet, "same")["choices"]
        # The first daemon's server was never touched: same pid, never down.
        assert a.target("same")["pid"] == pid_a and a.target("same")["state"] == "ready"
        assert [e["new"] for e in a.events("same") if e["kind"] == "state"].count("ready") == 1
        assert psutil.pid_exists(pid_a) and psutil.pid_exists(pid_b)
        names = [[r["name"] for r in containers_of(o)] for o in owners]
        assert all(len(n) == 1 for n in names) and names[0] != names[1], names
        assert all(n[0].startswith("specfleet-same-") for n in names), names
    finally:
        if b is not None:
            b.stop()
        a.stop()
        for o in owners:
            remove_containers_of(o)


def test_an_on_demand_container_left_by_a_killed_daemon_is_removed_at_the_next_start(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    # Issue 30: the next daemon showed it `unloaded` while it still ran and held its port,
    # and that daemon's SIGTERM left it running too.
    fleet = container_fleet(tmp_path, model, image, start="on_demand")
    name = next(iter(yaml.safe_load(fleet.read_text())["targets"]))
    daemon = DaemonProcess(fleet)
    assert daemon.wait_state(name, "unloaded", timeout=60)
    assert proxy_completion(fleet, name)["choices"]  # loads it
    pid = daemon.wait_state(name, "ready", timeout=120)["pid"]
    daemon.proc.kill()  # kill -9: nothing is stopped
    daemon.stop()
    assert psutil.pid_exists(pid) and [r["state"] for r in containers_of(owner)] == ["running"]
    second = DaemonProcess(fleet)
    try:
        second.wait_state(name, "unloaded", timeout=60)
        # Gone before anything asked for the target again.
        wait_for(lambda: containers_of(owner) == [], 30, "the leftover container removed")
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        assert any("left running by an earlier daemon" in e["reason"]
                   for e in second.events(name)), second.events(name)
        assert proxy_completion(fleet, name)["choices"]  # and it loads again on demand
    finally:
        assert second.stop() == 0, second.log()
    assert containers_of(owner) == []


def test_a_container_that_podman_creates_but_cannot_start_is_not_left_behind(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    # The soak's first run: `podman run` with a CDI GPU device this machine lacks creates
    # the container, then fails; left `Created`, it outlived the daemon.
    if Path("/etc/cdi/nvidia.yaml").exists() or Path("/var/run/cdi/nvidia.yaml").exists():
        pytest.skip("this machine has NVIDIA CDI devices: the start would succeed")
    fleet = write_fleet(tmp_path, {"gpu": {
        "model": model, "port": free_port(), "launcher": "container", "gpus": [0],
        "container": {"image": image, **SANDBOX}}})
    daemon = DaemonProcess(fleet)
    try:
        failed = daemon.wait_state("gpu", "failed", timeout=60)
        assert "nvidia.com/gpu=0" in json.dumps(failed), failed
        assert containers_of(owner) == []  # removed at once, not at the next start
    finally:
        assert daemon.stop() == 0


def test_ctrl_c_at_a_terminal_stops_the_containers_too(
        tmp_path: Path, model: str, image: str, owner: str) -> None:
    # Ctrl-C sends SIGINT to the whole foreground process group: the daemon and whatever
    # podman commands it runs at that moment (its log followers). The daemon's own stop
    # must still remove its containers.
    fleet = container_fleet(tmp_path, model, image)
    daemon = DaemonProcess(fleet, own_group=True)
    try:
        for name in yaml.safe_load(fleet.read_text())["targets"]:
            daemon.wait_state(name, "ready", timeout=120)
        assert len(containers_of(owner)) == 2
        os.killpg(daemon.proc.pid, signal.SIGINT)  # what the terminal does
        assert daemon.proc.wait(120) == 0, daemon.log()[-3000:]
        assert containers_of(owner) == []
    finally:
        daemon.stop()
