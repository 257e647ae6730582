"""How fast the status page's login may be guessed at: not faster than a person types.

Per client address, the first FREE wrong tokens in a row are answered at once; from the
FREE-th on, the next try is refused (429, with Retry-After) for 2, 4, 8 ... seconds after
the last wrong one, at most MAX_LOCK. The right token is refused too while locked, or the
lock would not slow a guesser down; it ends the run of failures. Addresses whose last
failure is older than FORGET are dropped, so a scan of many addresses cannot grow it
without end. Pure: the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

FREE = 5
MAX_LOCK = 300.0
FORGET = 3600.0
MAX_CLIENTS = 10_000


@dataclass
class _Failures:
    count: int
    last: float


class LoginThrottle:
    def __init__(self) -> None:
        self._clients: dict[str, _Failures] = {}

    def wait(self, client: str, now: float) -> float:
        """Seconds before `client` may try again (0: now)."""
        seen = self._clients.get(client)
        if seen is None or seen.count < FREE:
            return 0.0
        return max(0.0, seen.last + min(MAX_LOCK, 2.0 ** (seen.count - FREE + 1)) - now)

    def failed(self, client: str, now: float) -> bool:
        """Count a wrong token; True once per run of failures: when it starts to lock (the
        moment to log it, once, not at every try)."""
        seen = self._clients.get(client)
        count = (seen.count if seen else 0) + 1
        self._clients[client] = _Failures(count, now)
        if len(self._clients) > MAX_CLIENTS:
            self._clients = {c: f for c, f in self._clients.items() if now - f.last < FORGET}
        return count == FREE

    def succeeded(self, client: str) -> None:
        self._clients.pop(client, None)
