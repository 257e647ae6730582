"""Who a request's key belongs to and what it may do (docs/api.md, "Keys and scopes").

Keys come from the fleet file: `daemon.api_token` (the old single token: every scope, named
`api_token` in the logs) and the named keys of `daemon.keys`, each with its scopes. Each
secret is read from its file or variable at every use, so a key is rotated by writing its
file (or restarting with a new variable): the old key stops working at once. A key whose
source cannot be read matches nothing (the API fails closed for it, never open). The name is
what the request log and the events say; the secret never leaves this module.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.config.daemonsettings import ApiKey
from supervisor.config.schema import Fleet
from supervisor.errors import SpecfleetError

SCOPES = ("read", "inference", "admin")


@dataclass(frozen=True)
class Holder:
    """The key a request came with: its name and what it grants."""

    name: str
    scopes: frozenset[str]
    targets: frozenset[str] | None = None  # the inference scope's targets; None: all

    def grants(self, scope: str) -> bool:
        # Administration includes reading: the page shows what its buttons act on.
        return scope in self.scopes or (scope == "read" and "admin" in self.scopes)

    def may_use(self, target: str) -> bool:
        return self.grants("inference") and (self.targets is None or target in self.targets)

    def refusal(self, scope: str, what: str) -> str:
        """The 403's reason: the missing scope, named."""
        has = ", ".join(s for s in SCOPES if s in self.scopes) or "none"
        return f"key {self.name!r} lacks the {scope} scope needed to {what} (it has: {has})"


# When nothing is configured (a loopback-only daemon): everyone may do everything.
OPEN = Holder("(no key configured)", frozenset(SCOPES))


class KeyRing:
    """The fleet's keys, looked up by secret. `fleet` is read at each call: the daemon's
    settings are the ones it started with, but the object may be replaced by a reload."""

    def __init__(self, fleet: Callable[[], Fleet]) -> None:
        self._fleet = fleet

    def _sources(self) -> list[tuple[Holder, ApiKey, str]]:
        daemon = self._fleet().daemon
        out = []
        if daemon.api_token is not None:
            out.append((Holder("api_token", frozenset(SCOPES)), daemon.api_token,
                        "daemon.api_token"))
        for name, key in daemon.keys.items():
            out.append((Holder(name, frozenset(key.scopes),
                               frozenset(key.targets) if key.targets is not None else None),
                        key, f"daemon.keys.{name}"))
        return out

    def configured(self) -> bool:
        daemon = self._fleet().daemon
        return daemon.api_token is not None or bool(daemon.keys)

    def holder(self, given: str) -> Holder | None:
        """The key whose secret is `given`, or None. Every key is compared (no early exit on
        a match), each in constant time, so the time taken says nothing about which."""
        found = None
        for holder, source, where in self._sources():
            try:
                secret = source.read(where)
            except SpecfleetError:
                continue  # unreadable: matches nothing
            if secret and hmac.compare_digest(given.encode(), secret.encode()):
                found = found or holder
        return found

    def first_reader(self) -> str | None:
        """A secret that may read the status (`specfleet status` sends it): the api_token,
        else the first named key with read (or admin) scope; None when none can be read."""
        for holder, source, where in self._sources():
            if holder.grants("read"):
                try:
                    return source.read(where) or None
                except SpecfleetError:
                    continue
        return None
