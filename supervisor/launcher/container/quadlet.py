"""A target as a Quadlet `.container` unit: what `specfleet units render` emits for
`launcher: container` where podman has Quadlet (4.4 and later; podman-systemd.unit(5)). Pure.

Debian 12's podman here is 4.3.1, without Quadlet, which is why `quadlet_support` says why
not rather than writing a file that nothing reads.
"""

from __future__ import annotations

import re

from supervisor.launcher.container.command import (
    LABEL_SPEC,
    LABEL_TARGET,
    ContainerRun,
    container_name,
    spec_hash,
)
from supervisor.launcher.systemd.unitfile import quote
from supervisor.plugin.values import LaunchSpec

QUADLET_SINCE = (4, 4)


def quadlet_support(podman_version: str) -> tuple[bool, str]:
    """Whether this podman (`podman --version` output) reads Quadlet files, and why not."""
    m = re.search(r"(\d+)\.(\d+)", podman_version)
    if m is None:
        return False, f"cannot tell the podman version from {podman_version.strip()!r}"
    found = (int(m.group(1)), int(m.group(2)))
    if found < QUADLET_SINCE:
        return False, (f"podman {found[0]}.{found[1]} has no Quadlet (it came in 4.4); run the "
                       "target with launcher: container under the daemon instead")
    return True, f"podman {found[0]}.{found[1]} reads Quadlet files"


def render(target: str, spec: LaunchSpec, run: ContainerRun, *, stop_grace: float,
           env_file: str | None = None) -> str:
    """`specfleet-<target>.container`: the same container the launcher would run."""
    lines = [
        "# Written by specfleet; it is rewritten when the target's command changes.",
        "[Unit]",
        f"Description=specfleet target {target} (container {run.image})",
        "After=network-online.target",
        "",
        "[Container]",
        f"ContainerName={container_name(target)}",
        f"Image={run.image}",
        f"Label={LABEL_TARGET}={target}",
        f"Label={LABEL_SPEC}={spec_hash(spec, run)}",
        "Exec=" + " ".join(quote(a) for a in spec.argv[1:]),
    ]
    if run.host_network:
        lines.append("Network=host")
    elif run.port is not None:
        lines.append(f"PublishPort={run.host}:{run.port}:{run.port}")
    lines += [f"Volume={path}:{path}:ro" for path in run.mounts]
    gpus = ("all",) if run.gpus == "all" else run.gpus
    lines += [f"AddDevice=nvidia.com/gpu={g}" for g in gpus]
    if env_file:
        lines.append(f"EnvironmentFile={quote(env_file)}")
    # The runtime's command is the entry point, as the launcher runs it (command.run_argv).
    podman_args = [f"--entrypoint={quote(spec.argv[0])}"]
    podman_args += [f"--runtime={run.runtime}"] if run.runtime else []
    podman_args += [f"--ulimit={u}" for u in run.ulimits]
    lines.append("PodmanArgs=" + " ".join(podman_args))
    lines += ["", "[Service]", "Restart=no",
              f"TimeoutStopSec={max(1, round(stop_grace))}s", ""]
    return "\n".join(lines)
