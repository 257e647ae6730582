"""A target waiting for what this host lacks (state `waiting`): a model or draft file that is
missing, unreadable or truncated (a NAS not mounted yet after a reboot, a download still
running), a runtime binary that is not there, a registry or cluster that does not answer, a
port another program holds. What the fleet file says wrong is refused at `check` and at a
reload; what the world lacks is one target's: the others start, this one says what it waits
for (status, the page, `/v1/targets`, a 503 with the reason to its requests) and looks again
on its own, with backoff, never giving up: a mount may come back in a minute or in a day.

Looking again is cheap where the lack can be read: the backend's own checks of its files
and binary (the ones `check` reports, severity MISSING) and a truncated GGUF (cached per
file size and times, so a file that grows is read again), or a bind of the port. Where it
cannot (a registry, a cluster), the start itself is tried again.
Pure but for the file system and a socket; the owner (owner.py) does the waiting.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.config.schema import Restart
from supervisor.config.sourcemap import MISSING
from supervisor.models.gguf import incomplete
from supervisor.plugin.backend import Backend

# Looking again: after the target's restart.backoff_initial, doubling, at most LOOK_MAX. A
# stat or a bind is cheap, and a mount that came back should serve within seconds; a start
# tried again (a registry) is not, so it backs off to RETRY_MAX (or restart.backoff_max).
LOOK_MAX, RETRY_MAX = 10.0, 60.0


@dataclass(frozen=True)
class Wait:
    """What a target waits for: `reason` as its state says it, `failure` the kind in its
    event (missing, unreachable, port_in_use) and `still` what says, when looked at again,
    why it still cannot start (None: gone, start now); None for a lack only a start can
    test (then the start is tried again after each delay)."""

    reason: str
    failure: str
    still: Callable[[], str | None] | None = None

    def delay(self, looks: int, restart: Restart) -> float:
        """Seconds before the `looks`-th look again (0-based), for the target's `restart`."""
        top = LOOK_MAX if self.still is not None else min(RETRY_MAX, restart.backoff_max)
        return min(top, restart.backoff_initial * 2.0 ** min(looks, 30))

    def said(self, looks: int, restart: Restart) -> str:
        """The state's reason: what it waits for and when it looks again."""
        how = "tries to start again" if self.still is None else "looks again"
        return (f"{self.reason}; the rest of the fleet is not affected; {how} in "
                f"{self.delay(looks, restart):g} s (then at most every "
                f"{self.delay(99, restart):g} s) and starts once it is there")


def lacking(backend: Backend) -> str | None:
    """What this host lacks for the backend's target now, or None: the backend's own checks
    of MISSING severity (its files, its binary), and a GGUF file shorter than its header.
    Blocking (stat, a header read)."""
    found = [p.message for p in type(backend).check(backend.target) if p.severity == MISSING]
    if not found and (why := incomplete(backend.model_files())) is not None:
        found.append(why)
    return "; ".join(dict.fromkeys(found)) or None


def port_taken(host: str, port: int) -> str | None:
    """Why the target's port cannot be bound now (another program holds it), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind = "" if host in ("0.0.0.0", "::", "*") else host
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind, port))
        except OSError as exc:
            return f"port {port} on {host or 'all addresses'} is held by another program " \
                   f"({exc.strerror or exc})"
    return None
