"""Who may use the API listener and the proxy: the bearer token (every client), or a
browser session of the status page (docs/ui.md).

- With a token configured, every path but the open ones needs `Authorization: Bearer
  <token>` or a valid session cookie; the status page's HTML paths send a browser
  without either to the login page instead of a 401.
- A request carried by the session cookie that changes state (not GET or HEAD) must also
  carry the session's CSRF token in a header: a cross-site form cannot set a header, and
  the cookie is SameSite=Strict besides.
- On the API listener, a state-changing request that a browser marks as cross-site
  (`Sec-Fetch-Site: cross-site`, or an `Origin` that is not this listener) is refused
  whatever its credentials, also when no token is configured: a web page the user visits
  must not restart targets on a loopback daemon. (The proxy serves web UIs of other
  origins on purpose and does not check this.)
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from supervisor.api.common import Handler, json_error

SESSION_COOKIE = "specfleet_session"
CSRF_HEADER = "X-Specfleet-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Sessions:
    """Browser sessions in memory (a daemon restart logs everyone out), each with its own
    CSRF token; expired after `ttl` seconds."""

    def __init__(self, ttl: float = 12 * 3600, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}  # id -> (csrf, expires)

    def create(self) -> str:
        now = self.clock()
        self._sessions = {k: v for k, v in self._sessions.items() if v[1] > now}
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = (secrets.token_urlsafe(32), now + self.ttl)
        return sid

    def csrf(self, sid: str) -> str | None:
        """The session's CSRF token; None if there is no such live session."""
        found = self._sessions.get(sid)
        if found is None or found[1] <= self.clock():
            return None
        return found[0]

    def drop(self, sid: str) -> None:
        self._sessions.pop(sid, None)


def cross_site(request: web.Request) -> bool:
    """Whether the browser says the request comes from another site."""
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        return True
    origin = request.headers.get("Origin")
    return bool(origin) and origin != "null" and urlsplit(origin).netloc != request.host


def auth_middleware(token: Callable[[], str | None], open_paths: set[str],
                    sessions: Sessions | None = None, pages: tuple[str, ...] = (),
                    login: str = "") -> Any:
    """`sessions`, `pages` and `login` only on the API listener (the status page)."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        writes = request.method not in SAFE_METHODS
        if sessions is not None and writes and cross_site(request):
            return json_error(403, "cross-site request refused: state-changing requests "
                              "must come from the status page itself or a non-browser client")
        expected = token()
        if expected is None or request.path in open_paths:
            return await handler(request)
        given = request.headers.get("Authorization", "")
        if expected and hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
            return await handler(request)
        csrf = sessions.csrf(request.cookies.get(SESSION_COOKIE, "")) if sessions else None
        if csrf is not None:
            if writes and not hmac.compare_digest(
                    request.headers.get(CSRF_HEADER, "").encode(), csrf.encode()):
                return json_error(403, f"missing or wrong {CSRF_HEADER} header (the status "
                                  "page sends it; this request did not come from it)")
            return await handler(request)
        if request.method == "GET" and request.path in pages:
            raise web.HTTPFound(login)
        return json_error(401, "missing or wrong token (Authorization: Bearer ...)")
    return check
