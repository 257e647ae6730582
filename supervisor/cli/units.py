"""`specfleet units`: render or install systemd units for the daemon and the targets."""

from __future__ import annotations

import argparse
from pathlib import Path

from supervisor.atomicfile import write_text
from supervisor.errors import SpecfleetError


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


def run(args: argparse.Namespace) -> int:
    if args.action == "render" and not args.dir:
        raise SpecfleetError("units render needs --dir DIR (where to write the unit files)")
    from supervisor.cli.common import load
    from supervisor.launcher.systemd.unitset import unit_files
    from supervisor.plugin.registry import default_registry

    registry = default_registry()
    fleet_path = Path(args.file).resolve()
    fleet = load(str(fleet_path), registry).fleet
    launcher, files = unit_files(fleet_path, fleet, registry, user=args.user,
                                 every_target=args.action == "render")
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
        launcher.disconnect()

    asyncio.run(reload())
    scope = "--user " if launcher.user else ""
    units = "specfleet.socket specfleet" if "specfleet.socket" in files else "specfleet"
    print(f"systemd reloaded; start the daemon with: systemctl {scope}enable --now {units}")
    return 0
