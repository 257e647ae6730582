"""The two daemon keys `specfleet status FILE` needs, its state_dir and its API token, read
without the full fleet-file loader.

Validating a fleet file builds every pydantic model of the schema (about 0.3 s of a 0.5 s
`status` here); status only has to find the daemon and authenticate to it. The light read
takes the YAML as the loader does (per-scalar `${VAR}` expansion, the same token rules)
and gives up on anything it does not expect, so that the full load runs and reports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.keyread import read_key
from supervisor.config.paths import default_state_dir
from supervisor.config.yamlsource import expand_env
from supervisor.errors import SpecfleetError


@dataclass(frozen=True)
class DaemonKeys:
    state_dir: Path
    # None: no token configured; "": configured but unreadable (the API fails closed, and so
    # does a request sent with it), as supervisor/api/token.py reads it.
    token: str | None


def _text(value: Any) -> str | None:
    """A string value as the loader would see it, or None where it would not be one."""
    if not isinstance(value, str):
        return None
    expanded, missing = expand_env(value, dict(os.environ))
    return None if missing else expanded


def _token(source: Any) -> tuple[bool, str | None]:
    """(understood, token) for `daemon.api_token`, read as the daemon reads it (ApiKey);
    an unset variable or an unreadable file is "" (fail closed)."""
    if source is None:
        return True, None
    if not isinstance(source, dict) or len(source) != 1:
        return False, None
    (kind, name), = source.items()
    where = _text(name)
    if where is None or kind not in ("env", "file"):
        return False, None
    try:
        return True, read_key(where if kind == "env" else None, where if kind == "file" else None,
                              "daemon.api_token")
    except SpecfleetError:
        return True, ""


def read(path: str) -> DaemonKeys | None:
    """The keys, or None when the full loader must decide (unreadable file, bad YAML,
    anything of an unexpected shape)."""
    try:
        doc = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                               yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return None
    daemon = doc.get("daemon") or {}
    if not isinstance(daemon, dict):
        return None
    if daemon.get("keys"):
        return None  # named keys: which one may read is the full load's to say
    state_dir = _text(daemon["state_dir"]) if "state_dir" in daemon else default_state_dir()
    understood, token = _token(daemon.get("api_token"))
    if state_dir is None or not understood:
        return None
    return DaemonKeys(Path(state_dir).expanduser(), token)
