"""soak.py's fleet: the fleet file with everything that runs on this machine at once, the
daemon run on it (killed, restarted, signalled by the faults), and what the faults and
checks read through the API; and the poller that asks what an open status page asks."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.serverproc import free_port, http
from supervisor.config.loader import load_fleet
from supervisor.launcher.container.command import container_name
from supervisor.plugin.registry import default_registry

REPO = Path(__file__).resolve().parent.parent

ARGS = ["--ctx-size", "2048", "--parallel", "2", "--threads", "1"]
HEALTH = {"interval": "1s", "timeout": "1s", "failures": 3, "start_timeout": "90s"}
RESTART = {"backoff_initial": "0.5s", "backoff_max": "2s", "stop_grace": "5s",
           "max_crashes": 1000, "window": "10m"}  # faults are not a crash loop to give up on
HOLD = 120.0  # daemon.proxy.hold
# daemon.keys: a key per use, each in its own file, as a home lab gives Prometheus, a router
# and its own scripts (docs/api.md, "Keys and scopes"); the key_rotated fault rewrites one.
KEYS = {"read": "soak-read", "inference": "soak-router", "admin": "soak-admin"}


class SoakFleet:
    """The soak's fleet file and daemon; what soak_faults.Faults acts through."""

    def __init__(self, work: Path, binary: str, model: str, image: str | None,
                 full_dir: str | None, lab: Any = None) -> None:
        # lab: a tests.systemd_lab.Lab, for a target with launcher: systemd. The daemon then
        # runs inside the lab's namespaces; pids in its status are the lab's, translated to
        # this side's before any fault or check uses them (host_pid).
        self.lab = lab
        self.work, self.fleet_path = work, work / "fleet.yaml"
        self.state_dir = full_dir or str(work / "state")
        self.full_dir = full_dir
        self.hold = HOLD
        self.api_addr, self.proxy_port = f"127.0.0.1:{free_port()}", free_port()
        # plain's own copy lies on a "NAS": a folder that the model_gone fault moves away
        # and back, as a mount that goes away; truncated_then_whole replaces the file.
        self.nas = work / "nas"
        self.nas.mkdir()
        own = self.nas / "plain-model.gguf"
        shutil.copyfile(model, own)
        self.keys_dir = work / "keys"
        self.keys_dir.mkdir()
        for scope in KEYS:
            self.rotate_key(scope)
        # The runtimes' command lines name the soak's directory (how leftovers are found);
        # the container's mount takes the real file.
        linked = work / "model.gguf"
        linked.symlink_to(model)
        real, model = model, str(linked)
        def common() -> dict[str, Any]:  # each target its own lists: a fault edits one
            return {"binary": binary, "args": list(ARGS), "health": dict(HEALTH),
                    "restart": dict(RESTART)}
        targets: dict[str, Any] = {
            "tuned": {**common(), "model": model, "port": free_port(),
                      "speculation": {"method": "ngram", "variant": "mod"}},
            "plain": {**common(), "model": str(own), "port": free_port()}}
        self.always, self.mounted, self.container = ["tuned", "plain"], "plain", None
        if image is not None:
            from tests.container_image import SANDBOX
            # gpus: none: the declared GPU memory would place it on "GPU 0", which podman
            # is then asked for as a CDI device this CPU machine does not have.
            targets["box"] = {**common(), "model": real, "port": free_port(), "gpus": "none",
                              "launcher": "container", "container": {"image": image, **SANDBOX},
                              "speculation": {"method": "ngram"}}
            del targets["box"]["binary"]
            self.container = "box"
        if lab is not None:
            targets["unit"] = {**common(), "model": model, "port": free_port(),
                               "launcher": "systemd"}
            self.always.append("unit")
        for name in ("od-a", "od-b", "od-c"):
            targets[name] = {**common(), "model": model, "port": free_port(),
                             "start": "on_demand", "idle_unload": "45s", "min_residency": "5s"}
        self.on_demand = ["od-a", "od-b", "od-c"]
        self.doc = {"version": 1, "daemon": {
            "state_dir": self.state_dir, "log_dir": str(work / "logs"), "api": self.api_addr,
            "proxy": {"listen": f"127.0.0.1:{self.proxy_port}", "hold": f"{HOLD:g}s"},
            "stop_targets_on_exit": True,
            "keys": {name: {"file": str(self.keys_dir / scope), "scopes": [scope]}
                     for scope, name in KEYS.items()}}, "targets": targets}
        self.write_raw_fleet(None)
        self.doc["daemon"]["gpu"] = {"memory": [self._two_of_three_fit()], "headroom": 0}
        self.write_raw_fleet(None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.trace_memory: Path | None = None  # a folder: the daemon runs under tracemalloc
        self._daemon_pid: int | None = None
        self.up = threading.Event()
        self.incarnations: list[int] = []

    def _two_of_three_fit(self) -> int:
        registry = default_registry()
        fleet = load_fleet(self.fleet_path, registry.check_target).fleet
        need = {n: registry.backend_for(t).memory_estimate(on_gpu=True).total
                for n, t in fleet.targets.items()}
        swapping = sorted(need[n] for n in self.on_demand)
        planned = [n for n, t in fleet.targets.items() if t.gpus != "none"]
        return sum(need[n] for n in planned if n not in self.on_demand) \
            + swapping[-1] + swapping[-2] + swapping[0] // 2

    # --- the daemon ---

    def start_daemon(self) -> None:
        log = (self.work / "daemon.log").open("ab")
        argv = [sys.executable, "-m", "supervisor", "run", str(self.fleet_path), "--json-logs"]
        if self.trace_memory is not None:  # soak.py --trace-memory: the same argv, traced
            argv[1:3] = [str(REPO / "benchmarks" / "traced_daemon.py"), str(self.trace_memory)]
        self.proc = subprocess.Popen(self.lab.ns(*argv) if self.lab else argv, cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=log,
                                     stdin=subprocess.DEVNULL)
        self._daemon_pid = None
        self.incarnations.append(self.daemon_pid())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}")
            try:
                if http(f"http://{self.api_addr}/healthz", timeout=2)[0] == 200:
                    self.up.set()
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the daemon's API did not answer within 60 s")

    def daemon_pid(self) -> int:
        """The daemon's pid on this side: the process itself, or in the lab nsenter's child."""
        assert self.proc is not None
        if self.lab is None:
            return self.proc.pid
        deadline = time.monotonic() + 10
        while self._daemon_pid is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(self.proc.pid).children()
                self._daemon_pid = children[0].pid if children else None
            time.sleep(0.05)
        if self._daemon_pid is None:
            raise RuntimeError("the daemon did not start inside the systemd lab")
        return self._daemon_pid

    def kill_daemon(self) -> None:
        assert self.proc is not None
        self.up.clear()
        os.kill(self.daemon_pid(), signal.SIGKILL)
        self.proc.wait(30)

    def stop_daemon(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.up.clear()
        os.kill(self.daemon_pid(), signal.SIGTERM)
        try:
            return self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9

    def signal(self, sig: int) -> None:
        os.kill(self.daemon_pid(), sig)

    def host_pid(self, pid: int) -> int | None:
        """This side's pid of the process the lab's daemon calls `pid` (its NSpid)."""
        if self.lab is None:
            return pid
        lab_ns = os.readlink(f"/proc/{self.lab.pid}/ns/pid")
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(OSError):
                host = proc.info["pid"]
                if os.readlink(f"/proc/{host}/ns/pid") != lab_ns:
                    continue
                for line in Path(f"/proc/{host}/status").read_text().splitlines():
                    if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                        return host
        return None

    # --- what faults and checks read and change ---

    def key(self, scope: str) -> str:
        """The key of `scope` as its file holds it now (read at each use, as the daemon does)."""
        return (self.keys_dir / scope).read_text().strip()

    def rotate_key(self, scope: str) -> tuple[str | None, str]:
        """A new secret for the key of `scope`, written whole (a rename): (old, new)."""
        path = self.keys_dir / scope
        old = path.read_text().strip() if path.exists() else None
        new = secrets.token_urlsafe(24)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(new + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)
        return old, new

    def proxy_status(self, path: str, key: str | None) -> int:
        """The status the proxy answers a GET of `path` with `key`."""
        return http(f"http://127.0.0.1:{self.proxy_port}{path}", timeout=10, key=key)[0]

    def complete(self, name: str) -> tuple[int, str]:
        """One short completion from `name` through the proxy: (status, body)."""
        code, body = http(f"http://127.0.0.1:{self.proxy_port}/v1/completions",
                          {"model": name, "prompt": "Hello", "max_tokens": 4},
                          timeout=HOLD + 30, key=self.key("inference"))
        return code, body.decode(errors="replace")

    def status(self) -> dict[str, Any]:
        code, body = http(f"http://{self.api_addr}/v1/targets", timeout=5, key=self.key("read"))
        status = json.loads(body) if code == 200 else {}
        for t in status.get("targets", []) if self.lab is not None else []:
            if t.get("pid"):  # the lab's pid: never to be signalled from here as it is
                t["pid"] = self.host_pid(t["pid"])
        return status

    def target(self, name: str) -> dict[str, Any]:
        return next((t for t in self.status().get("targets", []) if t["name"] == name), {})

    def daemon_block(self) -> dict[str, Any]:
        return self.status().get("daemon", {})

    def api_post(self, path: str) -> int:
        return http(f"http://{self.api_addr}{path}", {}, timeout=30, key=self.key("admin"))[0]

    def edit_fleet(self, change: Any) -> None:
        change(self.doc)
        self.write_raw_fleet(None)

    def write_raw_fleet(self, text: str | None) -> None:
        """The fleet file: `text` as is (a broken one), or None: the current good one."""
        data = text if text is not None else yaml.safe_dump(self.doc, sort_keys=False)
        tmp = self.fleet_path.with_suffix(".tmp")
        tmp.write_text(data)
        tmp.replace(self.fleet_path)

    def model_of(self, name: str) -> str:
        return str(self.doc["targets"][name]["model"])

    def container_name(self, name: str) -> str:
        return container_name(name, self.state_dir)

    def podman(self, *args: str) -> list[str]:
        """podman's argv, run where the daemon runs (its containers' pids are the lab's)."""
        return self.lab.ns("podman", *args) if self.lab is not None else ["podman", *args]


def poll_like_a_browser(fleet: SoakFleet, stop: threading.Event, errors: list[str]) -> None:
    """What an open status page asks for every 2 s: the fleet, /metrics, a target's page."""
    while not stop.wait(2.0):
        if not fleet.up.is_set():
            continue
        for path in ("/v1/targets", "/metrics", "/v1/targets/tuned", "/ui"):
            try:
                code, _ = http(f"http://{fleet.api_addr}{path}", timeout=10,
                               key=fleet.key("read"))
            except OSError as exc:
                code = repr(exc)  # type: ignore[assignment]
            if code not in (200, 302, 303, 401) and fleet.up.is_set():
                errors.append(f"{time.strftime('%H:%M:%S')} {path}: {code}")
