"""A real local Ray cluster for the tests: a head and two worker nodes, each a `ray start`
process on 127.0.0.1, the workers with one fake GPU each (`--num-gpus 1`) and a custom
resource naming them (`worker-a`, `worker-b`), which the fleet files' `ray.nodes` use.

Small on purpose (the test machine has 2 cores): one CPU per node in Ray's books, a
100 MB object store, no dashboard. Node death is noticed within seconds (health checks
every second, three misses), not Ray's default of about 15 s. Teardown kills every
process of the cluster's session, as `ray stop` would, without touching any other Ray on
the machine: found by its temp dir in the command line or, for the agents that retitle
themselves (`ray::DashboardAgent`) and outlive their raylet, as the raylets' children seen
while they lived.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

RAY = str(Path(sys.executable).parent / "ray")
WORKERS = ("worker-a", "worker-b")
_FAST_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3",
               "RAY_health_check_initial_delay_ms": "1000"}
_COMMON = ["--num-cpus", "1", "--object-store-memory", "100000000",
           "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]


@dataclass
class RayCluster:
    address: str
    temp_dir: str
    env: dict[str, str]
    started_s: float = 0.0
    nodes: dict[str, list[str]] = field(default_factory=dict)
    _known: dict[int, psutil.Process] = field(default_factory=dict)

    def processes(self, marker: str | None = None) -> list[psutil.Process]:
        """Processes of this cluster whose command line names its temp dir (and `marker`)."""
        out = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            if self.temp_dir in cmd and (marker is None or marker in cmd):
                out.append(proc)
        return out

    def remember(self) -> list[psutil.Process]:
        """Every process of the cluster seen so far, descendants included. The agents retitle
        themselves (`ray::DashboardAgent`, command line and environment overwritten) and
        outlive their raylet, so they are known only as its children, seen while it lived."""
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                for p in [proc, *proc.children(recursive=True)]:
                    self._known.setdefault(p.pid, p)
        return [p for p in self._known.values() if p.is_running()]

    def raylet_of(self, worker: str) -> psutil.Process:
        """The raylet of a worker node: the one whose static resources name the worker."""
        self.remember()  # its agents, before a test kills it
        for proc in self.processes("raylet"):
            cmd = " ".join(proc.cmdline())
            if proc.name() == "raylet" and worker in cmd:
                return proc
        raise AssertionError(f"no raylet found for {worker}")

    def end_actors(self) -> list[int]:
        """Kill every actor process (`ray::TargetActor`) of the cluster; their pids. Ray
        frees what a killed actor held; its runtime dies with it (PR_SET_PDEATHSIG)."""
        actors = []
        for proc in self.remember():
            with contextlib.suppress(psutil.Error):
                if proc.name().startswith("ray::TargetActor") or \
                        " ".join(proc.cmdline()).startswith("ray::TargetActor"):
                    proc.kill()
                    actors.append(proc)
        psutil.wait_procs(actors, timeout=10)
        return [p.pid for p in actors]

    def start_worker(self, worker: str) -> None:
        subprocess.run([RAY, "start", "--address", self.address, *_COMMON, "--num-gpus", "1",
                        "--temp-dir", self.temp_dir,
                        "--resources", json.dumps({worker: 1})], check=True, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def stop(self) -> None:
        procs = self.remember()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)


def ray_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("ray") is not None and os.path.exists(RAY)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    if not ray_available():
        pytest.skip("ray is not installed: pip install 'specfleet[ray]'")
    from tests.conftest import free_port
    port = free_port()
    # Short: the session's Unix sockets live under it (108-byte limit on their paths).
    temp_dir = tempfile.mkdtemp(prefix="sf-ray-", dir="/tmp")
    env = {**os.environ, **_FAST_DEATH, "RAY_USAGE_STATS_ENABLED": "0"}
    cluster = RayCluster(f"127.0.0.1:{port}", temp_dir, env)
    began = time.monotonic()
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(port), *_COMMON,
                        "--num-gpus", "0", "--include-dashboard", "false",
                        "--temp-dir", temp_dir, "--resources", json.dumps({"head": 1})],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       timeout=180)
        for worker in WORKERS:
            cluster.start_worker(worker)
        cluster.started_s = time.monotonic() - began
        print(f"ray cluster up in {cluster.started_s:.1f} s", file=sys.stderr)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
