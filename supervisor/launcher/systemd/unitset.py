"""The unit files `specfleet units` writes: the daemon's unit, a unit per target (those
with launcher: systemd, or every target for `render`), and Quadlet `.container` units for
launcher: container targets where podman reads them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from supervisor.config.schema import Fleet
from supervisor.launcher.container import quadlet
from supervisor.launcher.container.containerlauncher import ContainerLauncher
from supervisor.launcher.systemd import unitfile
from supervisor.launcher.systemd.systemdlauncher import SystemdLauncher
from supervisor.plugin.registry import Registry


def unit_files(fleet_path: Path, fleet: Fleet, registry: Registry, *, user: bool,
               every_target: bool) -> tuple[SystemdLauncher, dict[str, str]]:
    """(launcher, {file name: text}) for the daemon and the fleet's targets."""
    settings = fleet.daemon.systemd
    if user:
        settings = settings.model_copy(update={"scope": "user"})
    launcher = SystemdLauncher(settings, Path(fleet.daemon.state_dir).expanduser())
    files = daemon_units(fleet_path, fleet, user=launcher.user)
    for target in fleet.targets.values():
        if target.launcher == "container":
            continue  # Quadlet units, or why not: quadlet_files
        if target.launcher != "systemd" and not every_target:
            continue
        spec = registry.backend_for(target).launch_spec()
        text, secrets = launcher.render(target.name, spec, target.restart.stop_grace)
        if target.launcher != "systemd":
            text = (f"# Target {target.name} has launcher: process (it runs as a child of the "
                    "daemon);\n# this is the unit launcher: systemd would run.\n" + text)
        files[unitfile.unit_name(target.name)] = text
        if secrets is not None:
            files[f"{target.name}.env"] = secrets
    if every_target:
        files.update(quadlet_files(fleet, registry))
    return launcher, files


def daemon_units(fleet_path: Path, fleet: Fleet, *, user: bool) -> dict[str, str]:
    """specfleet.service and, where every listener is an IP address, specfleet.socket."""
    daemon = fleet.daemon
    listeners = [daemon.api] + ([daemon.proxy.listen] if daemon.proxy.enabled else [])
    streams = [unitfile.listen_stream(a) for a in listeners]
    bound = all(s is not None for s in streams)
    if not bound:
        print(f"(not written: {unitfile.SOCKET_UNIT}: systemd listens on IP addresses only, "
              f"and {', '.join(listeners)} names a host)")
    files = {unitfile.DAEMON_UNIT: unitfile.render_daemon(
        fleet_path, watchdog=daemon.systemd.watchdog, user=user, socket=bound)}
    if bound:
        files[unitfile.SOCKET_UNIT] = unitfile.render_socket([s for s in streams if s])
    return files


def quadlet_files(fleet: Fleet, registry: Registry) -> dict[str, str]:
    """`launcher: container` targets as Quadlet `.container` units where podman reads them
    (4.4 and later); otherwise a line saying why not, and nothing written."""
    targets = [t for t in fleet.targets.values() if t.launcher == "container"]
    version = subprocess.run(["podman", "--version"], capture_output=True, text=True,
                             check=False).stdout if targets and shutil.which("podman") else ""
    ok, why = quadlet.quadlet_support(version) if version else (
        False, "podman is not installed (Quadlet units are podman's)")
    state_dir = Path(fleet.daemon.state_dir).expanduser()
    launcher = ContainerLauncher(fleet.daemon.logs, state_dir, fleet.targets.__getitem__)
    files = {}
    for target in targets:
        if not ok or target.container.engine == "docker":
            reason = why if not ok else "engine: docker (Quadlet units are podman's)"
            print(f"(not written: specfleet-{target.name}.container for target {target.name}, "
                  f"launcher: container: {reason})")
            continue
        spec = registry.backend_for(target).launch_spec()
        _, run, _ = launcher.container_run(target.name, spec)
        files[f"specfleet-{target.name}.container"] = quadlet.render(
            target.name, spec, run, stop_grace=target.restart.stop_grace, env_file=run.env_file)
    return files
