"""What the benchmarks share: a runtime server in a process group of its own (killed as a
whole, also on error), plain HTTP, and clients run in threads."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 900,
         key: str | None = None) -> tuple[int, bytes]:
    """GET (or POST `body` as JSON) with the bearer `key`: (status, body), errors included."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Server:
    """One runtime server in its own process group; stop() kills the whole group."""

    live: ClassVar[list[Server]] = []

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        with log.open("wb") as out:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.proc.pid  # start_new_session: the group is the server's pid
        Server.live.append(self)

    def wait_ready(self, limit: float) -> float:
        deadline = self.started + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before /health "
                                   f"200:\n{tail(self.log)}")
            with contextlib.suppress(OSError):
                if http(f"{self.base}/health", timeout=2)[0] == 200:
                    return time.monotonic() - self.started
            time.sleep(0.25)
        raise RuntimeError(f"no /health 200 within {limit:.0f} s:\n{tail(self.log)}")

    def stop(self) -> None:
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and group_alive(self.pgid):
                self.proc.poll()  # reap the leader, or the group stays "alive" as a zombie
                time.sleep(0.2)
            if not group_alive(self.pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self in Server.live:
            Server.live.remove(self)


def vllm_server(python: Path, model: Path, served_name: str, spec: dict[str, Any] | None,
                log: Path, *, eager: bool = True, env: dict[str, str] | None = None) -> Server:
    """vLLM's OpenAI server on the CPU (the HF copy of gemma-3-270m, bf16, 1 GiB of KV
    cache, offline), in a process group of its own; `spec` its --speculative-config (None:
    no speculation), `env` added to the environment (LD_PRELOAD is cleared unless set
    there: a preload of the daemon's own does not belong in vLLM)."""
    port = free_port()
    full = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    full.pop("LD_PRELOAD", None)
    full.update(env or {})
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name,
           "--max-model-len", "2048", "--dtype", "bfloat16",
           *(["--enforce-eager"] if eager else [])]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return Server(cmd, full, port, log)


def tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_clients(client: Callable[[int], None], clients: int) -> float:
    """`client(c)` for c in range(clients), each in a thread; the wall time until all end."""
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started


def stop_daemon(proc: subprocess.Popen, wait: float) -> None:
    """SIGTERM a `specfleet run` started in a session of its own; its whole group killed
    if it has not stopped within `wait` seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def cpu_model() -> str:
    """The CPU's model name (runs on different machines are not comparable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"
