"""The container engine's command lines for a target (issue 18, groundwork): pure, so that
every flag is unit-tested; the launcher that runs them is not written yet (see the closing
note of the session that added this file).

Verified by hand with Debian's podman 4.3.1 and runc: `run -d --runtime runc --network
host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096` with the model mounted read-only at
the same path served /health in 4 s; `inspect` gives the server's host pid and, after it
died, `exited 137`; `wait` prints the exit status; `logs --tail N` the output.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor.plugin.backend import LaunchSpec

LABEL_TARGET = "io.specfleet.target"
LABEL_SPEC = "io.specfleet.spec"
# Lower than this sandbox's limits, which it cannot raise (no CAP_SYS_RESOURCE): a
# container asking for more is refused. Enough for llama-server and vLLM.
DEFAULT_ULIMITS = ("nofile=4096:4096", "nproc=4096:4096")


def container_name(target: str) -> str:
    """`specfleet-<target>`, lower-cased, anything an engine refuses replaced by `-`."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", target.lower()).strip("-.") or "target"
    return f"specfleet-{slug}"


@dataclass(frozen=True)
class ContainerRun:
    """Everything one `run` needs besides the runtime's own command line."""

    engine: str  # "podman" | "docker"
    image: str
    mounts: tuple[str, ...] = ()  # host paths mounted read-only at the same path
    host: str = "127.0.0.1"
    port: int | None = None  # published unless host networking
    host_network: bool = True
    gpus: tuple[int, ...] = ()
    runtime: str | None = None  # podman --runtime (runc here: crun refuses this host)
    ulimits: tuple[str, ...] = DEFAULT_ULIMITS
    env_file: str | None = None  # the environment, secrets included, never on argv
    extra: tuple[str, ...] = field(default=())


def spec_hash(spec: LaunchSpec, run: ContainerRun) -> str:
    """What a running container must match to be adopted: the command, the environment
    (values hashed with the rest, never shown) and the image."""
    data = {"argv": list(spec.argv), "env": dict(sorted(spec.env.items())),
            "image": run.image, "mounts": list(run.mounts), "gpus": list(run.gpus),
            "port": run.port, "host_network": run.host_network}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def run_argv(target: str, spec: LaunchSpec, run: ContainerRun) -> list[str]:
    """`<engine> run -d ...` for the target: named, labelled, the model files mounted, the
    port reachable, the GPUs passed the engine's way, the environment from a file."""
    argv = [run.engine, "run", "-d", "--name", container_name(target),
            "--label", f"{LABEL_TARGET}={target}",
            "--label", f"{LABEL_SPEC}={spec_hash(spec, run)}"]
    if run.runtime:
        argv += ["--runtime", run.runtime]
    for limit in run.ulimits:
        argv += ["--ulimit", limit]
    if run.host_network:
        argv += ["--network", "host"]
    elif run.port is not None:
        argv += ["-p", f"{run.host}:{run.port}:{run.port}"]
    for path in run.mounts:
        argv += ["-v", f"{path}:{path}:ro"]
    argv += _gpu_flags(run.engine, run.gpus)
    if run.env_file:
        argv += ["--env-file", run.env_file]
    argv += list(run.extra)
    return [*argv, run.image, *spec.argv]


def _gpu_flags(engine: str, gpus: Sequence[int]) -> list[str]:
    if not gpus:
        return []
    if engine == "docker":
        return ["--gpus", "device=" + ",".join(map(str, gpus))]
    # podman: the NVIDIA Container Toolkit's CDI devices.
    return [arg for g in gpus for arg in ("--device", f"nvidia.com/gpu={g}")]


def env_file_text(spec: LaunchSpec) -> str:
    """The environment as an engine's --env-file reads it (KEY=value lines, no quoting)."""
    for key, value in spec.env.items():
        if "\n" in value:
            raise ValueError(f"environment variable {key} holds a newline, which an env file "
                             "cannot carry")
    return "".join(f"{k}={v}\n" for k, v in sorted(spec.env.items()))


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
