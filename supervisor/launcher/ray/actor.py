"""The actor that holds one target's runtime process on a Ray node.

Each target with `launcher: ray` is one detached, named actor (`specfleet/<target>`)
whose child is the runtime. The actor outlives the daemon (detached), so a new daemon
adopts it; the runtime dies with the actor, never alone: it gets PR_SET_PDEATHSIG, and
the actor's worker process exits when its node's raylet dies.

This module is shipped to the nodes by value (cluster.py registers it with Ray's
cloudpickle), so a node needs Ray and Python, not specfleet: keep it to the standard
library, and import Ray inside methods only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
from typing import Any

_PR_SET_PDEATHSIG = 1
_KEEP_LINES = 2000  # lines kept for a reader that fell behind (a daemon restarting)
_GGUF_MAGIC = b"GGUF"


# The signals a runtime may be stopped by (launcher/process.py's STOP_SIGNALS; this module
# runs inside Ray's worker and imports nothing of the daemon's).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
                 signal.SIGUSR2)


def _die_with_actor() -> None:
    """Runs in the child between fork and exec: SIGKILL when the actor's thread dies; the
    stop signals at their defaults (launcher/process.py says why). Nothing is imported
    here: another thread may have held the import lock at the fork."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for sig in _STOP_SIGNALS:
        libc.signal(int(sig), 0)  # SIG_DFL
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def file_problem(role: str, path: str, daemon_size: int | None) -> str | None:
    """Why `path` cannot be the `role` file the runtime opens on this node, or None."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        return f"{role} file {path} does not exist"
    except OSError as exc:
        return f"{role} file {path} cannot be read: {exc.strerror or exc}"
    if path.endswith(".gguf") and head != _GGUF_MAGIC:
        return f"{role} file {path} is not a GGUF file (it starts with {head!r})"
    if daemon_size is not None and size != daemon_size:
        # The pairing guard and the VRAM planner read the daemon's copy: it must be this one.
        return (f"{role} file {path} has {size} bytes here and {daemon_size} on the daemon's "
                "machine: copy the same file to both")
    return None


class TargetActor:
    """One runtime process, its exit status and its recent output lines."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fingerprint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self._seq = 0  # number of lines ever read: a reader asks for those after its own
        self._returncode: int | None = None
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_signal = signal.SIGTERM

    async def where(self) -> dict[str, Any]:
        """The node this actor runs on, as Ray and the network know it."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "address": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "actor_pid": os.getpid(),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def check_files(self, files: dict[str, str], daemon_sizes: dict[str, int],
                          binary: str) -> list[str]:
        """Problems with the runtime and the model files as this node sees them (exists,
        executable; size, GGUF magic)."""
        problems = []
        if os.path.isabs(binary) and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            problems.append(f"the runtime {binary} is not an executable file")
        for role, path in files.items():
            if (why := file_problem(role, path, daemon_sizes.get(role))) is not None:
                problems.append(why)
        return problems

    async def start(self, argv: list[str], env: dict[str, str], cwd: str | None,
                    fingerprint: str, stop_signal: str = "SIGTERM") -> int:
        """Start the runtime; its pid. The node's CUDA_VISIBLE_DEVICES (set by Ray from the
        actor's num_gpus) is kept: GPU indices in the fleet file are another machine's."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self.fingerprint = fingerprint
        self._stop_signal = signal.Signals[stop_signal]
        child_env = {**os.environ, **{k: v for k, v in env.items()
                                      if k != "CUDA_VISIBLE_DEVICES"}}
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=child_env, cwd=cwd if cwd and os.path.isdir(cwd) else None,
            start_new_session=True, preexec_fn=_die_with_actor)
        threading.Thread(target=self._pump, name=f"output:{self.name}", daemon=True).start()
        return self._proc.pid

    def _pump(self) -> None:
        """Reader thread: output lines into the ring, then the exit status."""
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            self._loop_call(self._append, raw.decode(errors="replace").rstrip("\n"))
        self._proc.stdout.close()
        code = self._proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)  # helpers it forked go with it
        self._loop_call(self._exited, code)

    def _loop_call(self, fn: Any, arg: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closing: the actor is going
            self._loop.call_soon_threadsafe(fn, arg)

    def _append(self, line: str) -> None:
        self._lines.append(line)
        self._seq += 1
        self._wake()

    def _exited(self, code: int) -> None:
        self._returncode = code
        self._wake()

    def _wake(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    async def state(self) -> dict[str, Any]:
        return {"pid": self._proc.pid if self._proc else 0, "returncode": self._returncode,
                "fingerprint": self.fingerprint, "seq": self._seq}

    async def read(self, after: int, timeout: float) -> tuple[int, list[str], int | None]:
        """Lines after the `after`-th (long poll: waits up to `timeout` for some), the count
        of lines so far, and the exit status once the runtime has exited."""
        if self._seq <= after and self._returncode is None and self._changed is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        new = min(self._seq - after, len(self._lines))
        lines = list(self._lines)[len(self._lines) - new:] if new > 0 else []
        return self._seq, lines, self._returncode

    async def wait(self) -> int:
        while self._returncode is None:
            assert self._changed is not None
            await self._changed.wait()
        return self._returncode

    def _signal(self, sig: int) -> None:
        if self._proc is not None and self._returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    async def stop(self, grace: float) -> int:
        """SIGTERM (or the start's stop signal) to the runtime's process group, `grace`
        seconds, then SIGKILL."""
        self._signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self._signal(self._stop_signal)
        try:
            return await asyncio.wait_for(self.wait(), grace)
        except TimeoutError:
            self._signal(signal.SIGKILL)
            return await self.wait()

    async def kill(self) -> None:
        self._signal(signal.SIGKILL)

    async def ping(self) -> bool:
        return True
