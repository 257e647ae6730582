"""The API token that the API and the proxy demand, read from its source on each use.

Apart from the HTTP side so that `specfleet status`, which sends the token, does not load
aiohttp and prometheus-client to read a file.
"""

from __future__ import annotations

from supervisor.config.schema import Fleet
from supervisor.errors import SpecfleetError


def read_api_token(fleet: Fleet) -> str | None:
    """The configured API token, read on each use (a rotated file takes effect at once).
    None only when no token is configured; a configured token that is empty or cannot be
    read is "", which no request matches: the API fails closed, never open."""
    source = fleet.daemon.api_token
    if source is None:
        return None
    try:
        return source.read("daemon.api_token")
    except SpecfleetError:
        return ""
