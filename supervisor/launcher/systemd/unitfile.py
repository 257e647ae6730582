"""Unit files for the daemon and its targets. Pure: settings in, unit text out.

Target units: `Type=exec` (the start job fails if the runtime cannot be executed),
`Restart=no` (specfleet's policy decides restarts, once: a systemd restart as well would
count the same crash twice), `KillMode=control-group` (helpers the runtime forks go too),
`TimeoutStopSec=` the target's stop_grace, output to the journal. Secrets go through an
`EnvironmentFile=` with mode 0600, never `Environment=` (which `systemctl show` prints to
every user) and never the command line.

The daemon's unit: `Type=notify` (READY=1 once the fleet's first reconcile is done),
`WatchdogSec=` (WATCHDOG=1 is sent from the event loop, so a blocked loop gets the daemon
restarted), `Restart=on-failure`, `KillMode=mixed` (SIGTERM to the daemon alone, so it stops
its process-launcher children in order; systemd's SIGKILL reaches any that remain). With
`specfleet.socket` beside it (`Requires=`), systemd holds the API's and the proxy's listening
sockets across the daemon's restarts (api/listening.py).
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from supervisor.plugin.values import LaunchSpec

UNIT_PREFIX = "specfleet-"
DAEMON_UNIT = "specfleet.service"
SOCKET_UNIT = "specfleet.socket"
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


# The state dir of the daemon that wrote a target unit (systemd ignores X- keys): two
# daemons on one manager (two state dirs) share the unit namespace, and one must neither
# rewrite, adopt nor remove the other's units.
OWNER_KEY = "X-Specfleet-StateDir"


def owner_of(text: str) -> str | None:
    """The state dir a target unit's text names as its daemon's; None for a unit written
    before the key existed."""
    for line in text.splitlines():
        if line.startswith(f"{OWNER_KEY}="):
            return line.split("=", 1)[1].strip() or None
    return None


def unit_name(target: str) -> str:
    return f"{UNIT_PREFIX}{target}.service"


def target_of(unit: str) -> str | None:
    """The target name of a specfleet target unit, or None for any other unit."""
    if unit.startswith(UNIT_PREFIX) and unit.endswith(".service"):
        return unit[len(UNIT_PREFIX):-len(".service")]
    return None


def quote(arg: str) -> str:
    """One ExecStart= word, quoted as systemd parses it (systemd.service "Command lines")."""
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SAFE.match(escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _env_line(key: str, value: str) -> str:
    return quote(f"{key}={value}")


def render_target(name: str, spec: LaunchSpec, *, description: str, stop_grace: float,
                  working_directory: str, env_file: str | None,
                  state_dir: str | None = None) -> str:
    """The unit of one target. Secrets (spec.secret_env) belong in `env_file`; `state_dir`
    marks which daemon the unit belongs to (`owner_of`)."""
    public = {k: v for k, v in sorted(spec.env.items()) if k not in spec.secret_env}
    lines = [
        "# Written by specfleet; it is rewritten when the target's command changes.",
        "[Unit]",
        f"Description=specfleet target {name}: {description}",
        "After=network.target",
        *([f"{OWNER_KEY}={state_dir}"] if state_dir else []),
        "",
        "[Service]",
        "Type=exec",
        "ExecStart=" + " ".join(quote(a) for a in spec.argv),
        f"WorkingDirectory={quote(spec.cwd or working_directory)}",
    ]
    lines += [f"Environment={_env_line(k, v)}" for k, v in public.items()]
    if env_file and spec.secret_env:
        lines.append(f"EnvironmentFile={quote(env_file)}")
    lines += [
        "Restart=no",
        "KillMode=control-group",
        f"KillSignal={spec.stop_signal}",
        f"TimeoutStopSec={max(1, round(stop_grace))}s",
        "SendSIGKILL=yes",
        "StandardOutput=journal",
        "StandardError=journal",
        f"SyslogIdentifier={UNIT_PREFIX}{name}",
        "",
    ]
    return "\n".join(lines)


def render_env_file(spec: LaunchSpec) -> str:
    """KEY=value lines for the secrets, as EnvironmentFile= reads them (values quoted)."""
    out = []
    for key in sorted(spec.secret_env):
        value = spec.env[key].replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'{key}="{value}"')
    return "\n".join(out) + "\n"


def listen_stream(address: str) -> str | None:
    """HOST:PORT as systemd's ListenStream= takes it; None for a host name (systemd binds
    addresses only)."""
    host, _, port = address.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def render_socket(addresses: list[str]) -> str:
    """specfleet.socket: the daemon's listening sockets (ListenStream= each), held by systemd
    so that connections made while the daemon restarts wait instead of being refused."""
    lines = ["# Written by `specfleet units`. systemd holds these sockets and hands them to",
             "# each specfleet.service it starts: a connection made while the daemon restarts",
             "# waits in the backlog. A connection while the service is stopped starts it;",
             "# stop both (systemctl stop specfleet.socket specfleet) to stop for good.",
             "[Unit]", "Description=specfleet: the API's and the proxy's listening sockets",
             "", "[Socket]"]
    lines += [f"ListenStream={a}" for a in addresses]
    lines += ["", "[Install]", "WantedBy=sockets.target", ""]
    return "\n".join(lines)


def render_daemon(fleet_file: Path, *, watchdog: float, python: str | None = None,
                  user: bool = False, environment: Mapping[str, str] | None = None,
                  socket: bool = False) -> str:
    exec_start = [python or sys.executable, "-m", "supervisor", "run", str(fleet_file),
                  "--json-logs"]
    lines = [
        "# Written by `specfleet units`.",
        "[Unit]",
        "Description=specfleet: supervisor of speculative-decoding LLM servers",
        "Documentation=https://github.com/specfleet/specfleet",
        "After=network-online.target" + (f" {SOCKET_UNIT}" if socket else ""),
        "Wants=network-online.target",
        *([f"Requires={SOCKET_UNIT}"] if socket else []),
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=" + " ".join(quote(a) for a in exec_start),
        "ExecReload=/bin/kill -HUP $MAINPID",
        f"WatchdogSec={max(1, round(watchdog))}s",
        "Restart=on-failure",
        "RestartSec=2s",
        "KillMode=mixed",
        "TimeoutStartSec=120s",
        "TimeoutStopSec=120s",
    ]
    lines += [f"Environment={_env_line(k, v)}" for k, v in sorted((environment or {}).items())]
    lines += ["", "[Install]", f"WantedBy={'default.target' if user else 'multi-user.target'}",
              ""]
    return "\n".join(lines)
