"""Every exit is a clean exit (issue 48): SIGTERM at a random moment of a busy fleet's life
(while targets start, load, are adopted from the previous daemon, hand over to a server
started beside, serve requests) ends the daemon with status 0, and leaves running only what
the docs say: with `stop_targets_on_exit: false` the Ray actor and the container (adopted by
the next daemon), never a process target's server; with `true`, nothing.

A fleet of the three kinds of launcher that run elsewhere than the daemon's own children:
a process target (llama-server), a container (podman, runc) and a Ray actor (a real local Ray
cluster). The moments are drawn from a seeded random generator, printed so that a failure
can be replayed (SPECFLEET_SIGTERM_SEED)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import DaemonProcess, llama_target, runtime_pids, wait_for, write_fleet
from tests.container_image import (
    SANDBOX,
    containers_of,
    remove_containers_of,
)
from tests.ray_cluster import RayCluster

pytestmark = pytest.mark.ray

ROUNDS = 5  # the last one stops the targets too: nothing may be left after it


@pytest.fixture
def leftovers(tmp_path: Path, ray_cluster: RayCluster) -> Iterator[None]:
    yield
    remove_containers_of(str(tmp_path / "state"))
    ray_cluster.end_actors()


def busy_fleet(tmp_path: Path, model: str, binary: str, image: str,
               cluster: RayCluster) -> Path:
    health = {"interval": "0.5s", "timeout": "2s", "failures": 4, "metrics_interval": "1s",
              "start_timeout": "120s"}
    boxed = llama_target(model, binary, launcher="container",
                         container={"image": image, **SANDBOX}, health=health)
    del boxed["binary"]  # the image's llama-server, found on its PATH
    return write_fleet(tmp_path, {
        "plain": llama_target(model, binary, speculation={"method": "ngram"}),
        "boxed": boxed,
        "remote": llama_target(model, binary, launcher="ray", gpus=[0],
                               ray={"nodes": ["worker-a", "worker-b"]}, health=health),
    }, ray={"address": cluster.address, "namespace": f"t-{tmp_path.name}"[:60]},
        stop_targets_on_exit=False)


def clients(fleet: Path, stop: threading.Event) -> list[threading.Thread]:
    """One client per target asking for short completions through the proxy until `stop`:
    what is in flight when SIGTERM comes may fail, never hang or crash the daemon."""
    proxy = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]

    def ask(name: str) -> None:
        body = json.dumps({"model": name, "prompt": "def f(x):\n    return", "max_tokens": 8,
                           "temperature": 0}).encode()
        while not stop.is_set():
            req = urllib.request.Request(f"http://{proxy}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30).read()
            except (OSError, urllib.error.HTTPError):
                time.sleep(0.2)
    threads = [threading.Thread(target=ask, args=(n,), daemon=True)
               for n in ("plain", "boxed", "remote")]
    for t in threads:
        t.start()
    return threads


def restart_through_the_api(fleet: Path, name: str) -> None:
    """A restart beside the serving server (a handover), where one serves now."""
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    req = urllib.request.Request(f"http://{api}/v1/targets/{name}/restart", b"", method="POST")
    # Not serving yet, or the daemon is stopping: the moment is what it is.
    with contextlib.suppress(OSError):
        urllib.request.urlopen(req, timeout=10).read()


def test_sigterm_at_random_moments_of_a_busy_fleet_exits_0_and_leaves_what_the_docs_say(
        tmp_path, model, llama_server_bin, image, ray_cluster, leftovers):
    seed = int(os.environ.get("SPECFLEET_SIGTERM_SEED", time.time_ns() % 100_000))
    rng = random.Random(seed)
    print(f"SPECFLEET_SIGTERM_SEED={seed}")
    fleet = busy_fleet(tmp_path, model, llama_server_bin, image, ray_cluster)
    state = str(tmp_path / "state")
    for n in range(ROUNDS):
        last = n == ROUNDS - 1
        if last:  # the last daemon stops the actor and the container too
            doc = yaml.safe_load(fleet.read_text())
            doc["daemon"]["stop_targets_on_exit"] = True
            fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
        daemon = DaemonProcess(fleet)
        stop = threading.Event()
        threads = clients(fleet, stop)
        # From `run`'s first step (before it, for the ~0.1 s the interpreter takes to import
        # the CLI, SIGTERM ends it as any program: nothing has started) to serving, the
        # previous daemon's actor and container adopted on the way.
        moment = rng.uniform(0.25, 12.0)
        handover = rng.random() < 0.5
        time.sleep(moment)
        if handover:
            restart_through_the_api(fleet, rng.choice(["plain", "boxed", "remote"]))
            time.sleep(rng.uniform(0.0, 2.0))
        states = {t["name"]: t["state"] for t in daemon.status().get("targets", [])}
        what = f"round {n} (seed {seed}): SIGTERM {moment:.1f} s after the start" + (
            " and a restart" if handover else "") + f"; states then {states}"
        code = daemon.stop(timeout=90)
        stop.set()
        for t in threads:
            t.join(35)
        log = daemon.log()
        assert code == 0, f"{what}: exit {code}\n{log}"
        assert "Traceback" not in log and "SIGABRT" not in log and "*** " not in log, \
            f"{what}\n{log}"
        # A process target's server never outlives its daemon, whatever the moment.
        assert by_keeper(tmp_path)["daemon"] == [], f"{what}: left running\n{log}"
        if last:
            wait_for(lambda: by_keeper(tmp_path) == {"daemon": [], "container": [], "ray": []},
                     30, f"{what}: every server to be stopped")
            assert not [c for c in containers_of(state) if c["state"] == "running"], what


def by_keeper(tmp_path: Path) -> dict[str, list[int]]:
    """The test's llama-servers still running, by what runs them: a container (conmon above
    it), a Ray actor (a `ray::` process above it), or else the daemon (or nobody: an orphan)."""
    out: dict[str, list[int]] = {"daemon": [], "container": [], "ray": []}
    for pid in runtime_pids(str(tmp_path)):
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            names = [p.name() for p in proc.parents()] + [
                " ".join(p.cmdline()[:1]) for p in proc.parents()]
        except psutil.Error:
            continue
        keeper = "container" if any("conmon" in n for n in names) else \
            "ray" if any(n.startswith("ray::") or "raylet" in n for n in names) else "daemon"
        out[keeper].append(pid)
    return out
