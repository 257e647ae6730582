"""The container engine's command lines for a target: pure, so that every flag is
unit-tested; launcher/container/containerlauncher.py runs them.

Verified by hand with Debian's podman 4.3.1 and runc: `run -d --runtime runc --network
host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096` with the model mounted read-only at
the same path served /health in 4 s; `inspect` gives the server's host pid and, after it
died, `exited 137`; `wait` prints the exit status; `logs --tail N` the output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from supervisor.plugin.values import LaunchSpec

LABEL_TARGET = "io.specfleet.target"
LABEL_SPEC = "io.specfleet.spec"
# The state dir of the daemon that started it: two daemons on one machine (two state dirs)
# never adopt or remove each other's containers.
LABEL_DAEMON = "io.specfleet.daemon"


def container_name(target: str, owner: str = "") -> str:
    """`specfleet-<target>`, lower-cased, anything an engine refuses replaced by `-`; for a
    daemon's container, followed by 8 hex digits of its state dir's sha256 (`owner`), so
    that two daemons with a target of one name run two containers, not one that each
    removes to start its own. A Quadlet unit (no daemon) keeps the plain name."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", target.lower()).strip("-.") or "target"
    if not owner:
        return f"specfleet-{slug}"
    return f"specfleet-{slug}-{hashlib.sha256(owner.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class ContainerRun:
    """Everything one `run` needs besides the runtime's own command line."""

    engine: str  # "podman" | "docker"
    image: str
    mounts: tuple[str, ...] = ()  # host paths mounted read-only at the same path
    host: str = "127.0.0.1"
    port: int | None = None  # published unless host networking
    host_network: bool = True
    gpus: tuple[int, ...] | Literal["all"] = ()
    runtime: str | None = None  # podman --runtime (runc here: crun refuses this host)
    ulimits: tuple[str, ...] = ()
    env_file: str | None = None  # the environment, secrets included, never on argv
    extra: tuple[str, ...] = field(default=())
    owner: str = ""  # LABEL_DAEMON's value


def spec_hash(spec: LaunchSpec, run: ContainerRun) -> str:
    """What a running container must match to be adopted: the command, the environment
    (values hashed with the rest, never shown) and the image."""
    data = {"argv": list(spec.argv), "env": dict(sorted(spec.env.items())),
            "image": run.image, "mounts": list(run.mounts), "gpus": run.gpus if isinstance(
                run.gpus, str) else list(run.gpus),
            "port": run.port, "host_network": run.host_network,
            # only where set: the hash of every container started before it stays the same
            **({"stop_signal": spec.stop_signal} if spec.stop_signal != "SIGTERM" else {})}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def run_argv(target: str, spec: LaunchSpec, run: ContainerRun) -> list[str]:
    """`<engine> run -d ...` for the target: named, labelled, the model files mounted, the
    port reachable, the GPUs passed the engine's way, the environment from a file. The
    runtime's command is the entry point (an image's own ENTRYPOINT would be prepended to
    it otherwise: the llama.cpp server image's is /app/llama-server)."""
    argv = [run.engine, "run", "-d", "--name", container_name(target, run.owner),
            "--label", f"{LABEL_TARGET}={target}",
            "--label", f"{LABEL_SPEC}={spec_hash(spec, run)}"]
    if run.owner:
        argv += ["--label", f"{LABEL_DAEMON}={run.owner}"]
    argv += _engine_flags(run)
    if run.host_network:
        argv += ["--network", "host"]
    elif run.port is not None:
        argv += ["-p", f"{run.host}:{run.port}:{run.port}"]
    for path in run.mounts:
        argv += ["-v", f"{path}:{path}:ro"]
    argv += _gpu_flags(run.engine, run.gpus)
    if run.env_file:
        argv += ["--env-file", run.env_file]
    if spec.stop_signal != "SIGTERM":  # SIGTERM is the engine's own default
        argv += ["--stop-signal", spec.stop_signal]
    argv += list(run.extra)
    return [*argv, "--entrypoint", spec.argv[0], run.image, *spec.argv[1:]]


def once_argv(argv: Sequence[str], run: ContainerRun) -> list[str]:
    """`<engine> run --rm ...` that runs one command of the image and ends (a backend's
    preflight: `llama-server --help`): the same OCI runtime and limits as the target's
    container, on the host's network, nothing mounted."""
    return [run.engine, "run", "--rm", *_engine_flags(run), "--network", "host",
            "--entrypoint", argv[0], run.image, *argv[1:]]


def _engine_flags(run: ContainerRun) -> list[str]:
    argv = ["--runtime", run.runtime] if run.runtime else []
    for limit in run.ulimits:
        argv += ["--ulimit", limit]
    return argv


def _gpu_flags(engine: str, gpus: Sequence[int] | str) -> list[str]:
    if not gpus:
        return []
    if engine == "docker":
        if gpus == "all":
            return ["--gpus", "all"]
        # docker reads --gpus as CSV: several devices must be quoted inside the value.
        devices = "device=" + ",".join(map(str, gpus))
        return ["--gpus", devices if len(gpus) == 1 else f'"{devices}"']
    # podman: the NVIDIA Container Toolkit's CDI devices.
    if gpus == "all":
        return ["--device", "nvidia.com/gpu=all"]
    return [arg for g in gpus for arg in ("--device", f"nvidia.com/gpu={g}")]


def gpu_request(target_gpus: object, env: Mapping[str, str]
                ) -> tuple[tuple[int, ...] | Literal["all"], dict[str, str]]:
    """The GPUs to pass into the container, and the environment inside it. The backend's
    CUDA_VISIBLE_DEVICES names host indices; a container sees only the GPUs passed, counted
    from 0, so the variable is renumbered (GPU 2 alone is device 0 inside)."""
    inside = dict(env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return ("all" if target_gpus == "all" else ()), inside
    if not visible.strip():
        return (), inside  # gpus: none
    try:
        gpus = tuple(int(g) for g in visible.split(","))
    except ValueError:  # UUIDs or MIG names: passed as written would not match; all GPUs
        return "all", inside
    inside["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    return gpus, inside


def mounts_for(spec: LaunchSpec, files: Sequence[str], volumes: Sequence[str]) -> tuple[str, ...]:
    """Host paths to mount read-only at the same path: the target's model files, every
    existing absolute path in the runtime's arguments (`--flag=/path` too; not argv[0], the
    command inside the image) and the fleet file's `volumes`, each once, in that order."""
    found: list[str] = list(files)
    for arg in spec.argv[1:]:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if value.startswith("/") and os.path.exists(value):
            found.append(value)
    found += [os.path.expanduser(v) for v in volumes]
    return tuple(dict.fromkeys(os.path.normpath(p) for p in found))


def env_file_text(env: Mapping[str, str]) -> str:
    """The environment as an engine's --env-file reads it (KEY=value lines, no quoting)."""
    for key, value in env.items():
        if "\n" in value:
            raise ValueError(f"environment variable {key} holds a newline, which an env file "
                             "cannot carry")
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items()))


@dataclass(frozen=True)
class Exited:
    """A container's end, from `inspect`'s State."""

    running: bool
    returncode: int | None  # as subprocess says: 137 from the engine is -9 (SIGKILL)
    oom_killed: bool


def exit_from_state(state: Mapping[str, Any]) -> Exited:
    running = bool(state.get("Running")) or state.get("Status") == "running"
    if running:
        return Exited(True, None, False)
    code = int(state.get("ExitCode") or 0)
    # The engine reports death by signal N as 128 + N (the shell's convention).
    returncode = -(code - 128) if 128 < code < 160 else code
    return Exited(False, returncode, bool(state.get("OOMKilled")))
