"""Reading an API key from where the fleet file says it is: one function, used by the
schema's ApiKey (the daemon, the proxy) and by `specfleet status`'s light read of the fleet
file, which must not build the pydantic schema (cli/daemonkeys.py)."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.errors import SpecfleetError


def read_key(env: str | None, file: str | None, where: str) -> str:
    """The secret in environment variable `env`, or in `file`; `where` names the setting in
    the message when it is missing. Read on every use, so a rotated key file takes effect
    without a restart."""
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise SpecfleetError(f"{where}.env names {env}, which is not set")
        return value
    try:
        return Path(str(file)).expanduser().read_text().strip()
    except OSError as exc:
        raise SpecfleetError(f"cannot read {where}.file {file}: {exc.strerror}") from exc
