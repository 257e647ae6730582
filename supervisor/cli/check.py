"""`specfleet check`: validate a fleet file and print the exact command of every target."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from supervisor.daemon import statusfile


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a fleet file and print each target's command",
                       description="Validate FILE (every problem at once, with its line) and "
                       "print the exact command each target would run. Exit 2 if invalid.")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import psutil

    from supervisor.cli.common import load
    from supervisor.cli.pull import resolved_targets
    from supervisor.gpu import nvml, placement
    from supervisor.launcher.installed import InstalledLaunchers
    from supervisor.plugin.registry import default_registry

    registry = default_registry()
    loaded = load(args.file, registry)
    fleet = loaded.fleet
    targets, kits, unresolved = resolved_targets(fleet)
    for problem in unresolved:
        print(f"{args.file}: {problem}", file=sys.stderr)
    if unresolved:
        return 2
    print(f"{args.file}: OK, {len(fleet.targets)} target(s)")
    for said in kits:
        print(said)
    backends = {name: registry.backend_for(t) for name, t in targets.items()}
    launchers = InstalledLaunchers(registry, fleet.daemon, targets.__getitem__)
    fleet_plan = placement.make_plan(backends, nvml.read(), fleet.daemon.gpu,
                                     ours=_running_fleet_vram(fleet.daemon.state_dir),
                                     host_available=psutil.virtual_memory().available)
    for target in targets.values():
        backend = backends[target.name]
        spec = backend.launch_spec(placement=placement.assignment_in(fleet_plan, target.name))
        method = target.speculation.method
        if target.speculation.variant:
            method += f" ({target.speculation.variant})"
        print(f"\n[{target.name}] backend {target.backend}, {target.base_url}, speculation "
              f"{method}, launcher {target.launcher}")
        print(f"  {spec.shell_line()}")
        for extra in backend.describe_launch(spec):
            print("  " + extra.replace("\n", "\n  "))
        if (how := launchers.for_target(target).describe(target.name, spec)) is not None:
            print(f"  run as: {how}")
    print("\n" + placement.render(fleet_plan))
    refused = fleet_plan.plan.refused if fleet_plan.plan is not None else {}
    if refused and fleet.daemon.gpu.refuse:
        for name, why in refused.items():
            print(f"{args.file}: targets.{name}: does not fit in GPU memory: {why}",
                  file=sys.stderr)
        return 2
    return 0


def _running_fleet_vram(state_dir: str) -> dict[int, int]:
    """VRAM per GPU held by the targets of a daemon running on this state_dir: `check` on a
    running system plans as if that fleet were replaced, not added."""
    status = statusfile.read(Path(state_dir).expanduser(),
                             warn=lambda problem: print(f"specfleet: {problem}", file=sys.stderr))
    if status is None or not statusfile.daemon_alive(status.get("daemon", {})):
        return {}
    from supervisor.gpu import placement

    return placement.held_vram(t.get("resources") or {} for t in status.get("targets", []))
