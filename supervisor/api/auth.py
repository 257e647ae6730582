"""Who may use the API listener and the proxy: a bearer key (keys.py: the api_token or a
named key with its scopes), or a browser session of the status page (docs/ui.md), which
holds the key it logged in with.

- With a key configured, every path but the open ones needs `Authorization: Bearer <key>`
  or a valid session cookie; the status page's HTML paths send a browser without either to
  the login page instead of a 401. The key must grant the path's scope (`scope_of`: on the
  API, reading for GET and administration for what changes state; on the proxy,
  inference): else 403 with a reason that names the key and the missing scope. The key
  is left in `request[KEY]` for the handler (the proxy's targets, the logs).
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
from supervisor.api.keys import OPEN, Holder, KeyRing

SESSION_COOKIE = "specfleet_session"
CSRF_HEADER = "X-Specfleet-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
KEY = web.RequestKey("key", Holder)  # the key a request came with (set by the middleware)


class Sessions:
    """Browser sessions in memory (a daemon restart logs everyone out), each with its own
    CSRF token and the key it logged in with; expired after `ttl` seconds."""

    def __init__(self, ttl: float = 12 * 3600, clock: Callable[[], float] = time.time) -> None:
        self.ttl = ttl
        self.clock = clock
        self._sessions: dict[str, tuple[str, float, Holder]] = {}  # id -> (csrf, expires, key)

    def create(self, holder: Holder = OPEN) -> str:
        now = self.clock()
        self._sessions = {k: v for k, v in self._sessions.items() if v[1] > now}
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = (secrets.token_urlsafe(32), now + self.ttl, holder)
        return sid

    def csrf(self, sid: str) -> str | None:
        """The session's CSRF token; None if there is no such live session."""
        found = self.get(sid)
        return found[0] if found is not None else None

    def get(self, sid: str) -> tuple[str, Holder] | None:
        """The live session's CSRF token and key; None if there is no such live session."""
        found = self._sessions.get(sid)
        if found is None or found[1] <= self.clock():
            return None
        return found[0], found[2]

    def drop(self, sid: str) -> None:
        self._sessions.pop(sid, None)


def cross_site(request: web.Request) -> bool:
    """Whether the browser says the request comes from another site."""
    if request.headers.get("Sec-Fetch-Site") == "cross-site":
        return True
    origin = request.headers.get("Origin")
    return bool(origin) and origin != "null" and urlsplit(origin).netloc != request.host


def api_scope(request: web.Request) -> tuple[str, str]:
    """The scope a request to the API listener needs, and what it does (for the 403)."""
    if request.method in SAFE_METHODS:
        return "read", f"read {request.path}"
    return "admin", f"{request.method} {request.path}"


def proxy_scope(request: web.Request) -> tuple[str, str]:
    return "inference", f"use the models ({request.path})"


def auth_middleware(keys: KeyRing, open_paths: set[str],
                    scope_of: Callable[[web.Request], tuple[str, str]] = api_scope,
                    sessions: Sessions | None = None, pages: tuple[str, ...] = (),
                    login: str = "") -> Any:
    """`sessions`, `pages` and `login` only on the API listener (the status page)."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        writes = request.method not in SAFE_METHODS
        if sessions is not None and writes and cross_site(request):
            return json_error(403, "cross-site request refused: state-changing requests "
                              "must come from the status page itself or a non-browser client")
        request[KEY] = OPEN
        if not keys.configured() or request.path in open_paths:
            return await handler(request)
        given = request.headers.get("Authorization", "")
        holder = keys.holder(given[7:]) if given.startswith("Bearer ") else None
        found = sessions.get(request.cookies.get(SESSION_COOKIE, "")) \
            if holder is None and sessions is not None else None
        if found is not None:
            csrf, holder = found
            if writes and not hmac.compare_digest(
                    request.headers.get(CSRF_HEADER, "").encode(), csrf.encode()):
                return json_error(403, f"missing or wrong {CSRF_HEADER} header (the status "
                                  "page sends it; this request did not come from it)")
        if holder is None:
            if request.method == "GET" and request.path in pages:
                raise web.HTTPFound(login)
            return json_error(401, "missing or wrong token or key (Authorization: Bearer ...)")
        scope, what = scope_of(request)
        if not holder.grants(scope):
            return json_error(403, holder.refusal(scope, what))
        request[KEY] = holder
        return await handler(request)
    return check
