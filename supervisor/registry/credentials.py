"""Registry credentials from where docker and podman keep them, never from argv or the
fleet file (docs/modelkit-formats.md §5.3).

Looked up for a registry host, in docker's order: `DOCKER_AUTH_CONFIG` (JSON, as CI systems
set it), then `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`), then podman's
`$REGISTRY_AUTH_FILE` or `${XDG_RUNTIME_DIR}/containers/auth.json`: in each, a
`credHelpers[host]` or `credsStore` helper (`docker-credential-<name> get`, the host on
stdin), else `auths[host].auth` (base64 of user:password). None when nothing is found:
the registry is asked anonymously.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Credentials:
    username: str
    secret: str  # a password, or an identity token when username is "<token>"

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(username={self.username!r}, secret=***)"


def _configs(env: Mapping[str, str]) -> list[dict[str, Any]]:
    found = []
    if raw := env.get("DOCKER_AUTH_CONFIG"):
        found.append(raw)
    docker = Path(env.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    podman = Path(env["REGISTRY_AUTH_FILE"]) if env.get("REGISTRY_AUTH_FILE") else (
        Path(env["XDG_RUNTIME_DIR"]) / "containers" / "auth.json"
        if env.get("XDG_RUNTIME_DIR") else None)
    for path in (docker, podman):
        if path is not None and path.is_file():
            try:
                found.append(path.read_text(encoding="utf-8"))
            except OSError:
                continue
    configs = []
    for text in found:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            configs.append(value)
    return configs


def _helper(name: str, host: str) -> Credentials | None:
    program = shutil.which(f"docker-credential-{name}")
    if program is None:
        return None
    try:
        out = subprocess.run([program, "get"], input=host, capture_output=True, text=True,
                             timeout=30, check=True).stdout
        data = json.loads(out)
        return Credentials(str(data["Username"]), str(data["Secret"]))
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, TypeError):
        return None


def _inline(auths: Mapping[str, Any], host: str) -> Credentials | None:
    for key in (host, f"https://{host}", f"http://{host}", f"https://{host}/v1/",
                f"https://{host}/v2/"):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            return Credentials("<token>", str(entry["identitytoken"]))
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                continue
            return Credentials(user, password.strip("\x00"))
        if entry.get("username") and entry.get("password"):
            return Credentials(str(entry["username"]), str(entry["password"]))
    return None


def lookup(host: str, env: Mapping[str, str] | None = None) -> Credentials | None:
    """The credentials for registry `host` (with its port, as in the reference)."""
    for config in _configs(os.environ if env is None else env):
        helper = (config.get("credHelpers") or {}).get(host) or config.get("credsStore")
        if isinstance(helper, str) and (found := _helper(helper, host)):
            return found
        if found := _inline(config.get("auths") or {}, host):
            return found
    return None
