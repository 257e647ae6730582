"""`specfleet units`: render or install systemd units for the daemon and the targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.atomicfile import write_text
from supervisor.errors import SpecfleetError

if TYPE_CHECKING:
    from supervisor.config.schema import Fleet
    from supervisor.launcher.systemd.launcher import SystemdLauncher
    from supervisor.plugin.registry import BackendRegistry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("units", help="write systemd unit files for the daemon and the targets",
                       description="render: write the daemon's unit (Type=notify, watchdog) and "
                       "a unit per target into DIR, to read or to check with `systemd-analyze "
                       "verify`. install: write the daemon's unit and the units of targets with "
                       "launcher: systemd into the unit directory (daemon.systemd.unit_dir, "
                       "default /etc/systemd/system, or ~/.config/systemd/user with --user) and "
                       "reload systemd.")
    p.add_argument("action", choices=["render", "install"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--dir", help="output directory (render)")
    p.add_argument("--user", action="store_true", help="user units (systemctl --user)")
    p.set_defaults(func=run)


def _unit_files(args: argparse.Namespace,
                every_target: bool) -> tuple[SystemdLauncher, dict[str, str]]:
    """(launcher, {file name: text}) for the daemon and the fleet's targets."""
    from supervisor.cli.common import load
    from supervisor.launcher.systemd import units
    from supervisor.launcher.systemd.launcher import SystemdLauncher
    from supervisor.plugin.registry import default_registry

    registry = default_registry()
    fleet_path = Path(args.file).resolve()
    fleet = load(str(fleet_path), registry).fleet
    settings = fleet.daemon.systemd
    if args.user:
        settings = settings.model_copy(update={"scope": "user"})
    launcher = SystemdLauncher(settings, Path(fleet.daemon.state_dir).expanduser())
    files = {units.DAEMON_UNIT: units.render_daemon(fleet_path, watchdog=settings.watchdog,
                                                    user=launcher.user)}
    for target in fleet.targets.values():
        if target.launcher == "container":
            continue  # Quadlet units, or why not: _quadlet_files
        if target.launcher != "systemd" and not every_target:
            continue
        spec = registry.backend_for(target).launch_spec()
        text, secrets = launcher.render(target.name, spec, target.restart.stop_grace)
        if target.launcher != "systemd":
            text = (f"# Target {target.name} has launcher: process (it runs as a child of the "
                    "daemon);\n# this is the unit launcher: systemd would run.\n" + text)
        files[units.unit_name(target.name)] = text
        if secrets is not None:
            files[f"{target.name}.env"] = secrets
    if every_target:
        files.update(_quadlet_files(fleet, registry))
    return launcher, files


def _quadlet_files(fleet: Fleet, registry: BackendRegistry) -> dict[str, str]:
    """`launcher: container` targets as Quadlet `.container` units where podman reads them
    (4.4 and later); otherwise a line saying why not, and nothing written."""
    import shutil
    import subprocess

    from supervisor.launcher.container import quadlet
    from supervisor.launcher.container.launcher import ContainerLauncher

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


def run(args: argparse.Namespace) -> int:
    if args.action == "render" and not args.dir:
        raise SpecfleetError("units render needs --dir DIR (where to write the unit files)")
    launcher, files = _unit_files(args, every_target=args.action == "render")
    secrets = {n: t for n, t in files.items() if n.endswith(".env")}
    if args.action == "render":
        out = Path(args.dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if name in secrets:
                continue  # secrets are written where the unit expects them, by install or run
            (out / name).write_text(text)
            print(out / name)
        for name in secrets:
            print(f"(not written: {name}, the secrets file; `units install` and the daemon "
                  f"write it to {launcher.env_dir} with mode 0600)")
        return 0
    for name, text in files.items():
        path = (launcher.env_dir if name in secrets else launcher.unit_dir) / name
        try:
            write_text(path, text, 0o600 if name in secrets else 0o644)
        except OSError as exc:
            raise SpecfleetError(f"cannot write {path}: {exc.strerror} (system units need root; "
                                 "--user writes user units)") from exc
        print(path)

    import asyncio

    async def reload() -> None:
        await launcher.connect()
        await launcher.manager.reload()
        launcher.close()

    asyncio.run(reload())
    scope = "--user " if launcher.user else ""
    print(f"systemd reloaded; start the daemon with: systemctl {scope}enable --now specfleet")
    return 0
