"""The status page's side of the API listener (docs/ui.md): the pages (static files shipped
in the package, no build step), the browser's login with a key, and what the
pages read that the API did not have: a target's history, its log tail, the requests,
why it runs its tuned setting.

A login sets one cookie, the session (HttpOnly, SameSite=Strict); the page then reads
its CSRF token from /ui/session and sends it in a header with every state-changing
request (auth.py checks both). Any key that may read logs in (the api_token, or a named
key with read or admin scope); the session keeps the key's scopes, and /ui/session says
whether it may act, so a read key's page shows no buttons. Without a configured key (a
loopback-only daemon) the pages need no login, as the API needs none. Wrong keys at the
login are slowed down per client address, whichever key was meant (throttle.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import structlog
from aiohttp import web

from supervisor.api.auth import CSRF_HEADER, KEY, SESSION_COOKIE, Sessions
from supervisor.api.common import named_target
from supervisor.api.fleetview import FleetView
from supervisor.api.keys import OPEN, Holder
from supervisor.api.throttle import FREE, LoginThrottle

UI_DIR = Path(__file__).parent / "ui"
LOGIN = "/ui/login"
FAVICON = "/favicon.ico"
log = structlog.get_logger("specfleet")


class StatusPages:
    def __init__(self, fleet: FleetView, sessions: Sessions) -> None:
        self.fleet = fleet
        self.sessions = sessions
        self.throttle = LoginThrottle()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.root)
        app.router.add_get("/ui", self.page)
        app.router.add_get(FAVICON, self.favicon)
        app.router.add_get(LOGIN, self.login_page)
        app.router.add_post(LOGIN, self.login)
        app.router.add_post("/ui/logout", self.logout)
        app.router.add_get("/ui/session", self.session)
        app.router.add_static("/ui/static", UI_DIR / "static", show_index=False)
        app.router.add_get("/v1/targets/{name}/history", self.history)
        app.router.add_get("/v1/targets/{name}/logs", self.logs)
        app.router.add_get("/v1/targets/{name}/tuning", self.tuning)
        app.router.add_get("/v1/requests", self.requests)

    async def root(self, request: web.Request) -> web.Response:
        return _redirect("/ui")

    async def favicon(self, request: web.Request) -> web.FileResponse:
        """The tab's icon, before and after login (an SVG under the name browsers ask for)."""
        return web.FileResponse(UI_DIR / "favicon.svg",
                                headers={"Content-Type": "image/svg+xml"})

    async def page(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(UI_DIR / "index.html", headers=_NO_STORE)

    async def login_page(self, request: web.Request) -> web.Response:
        if not self.fleet.keyring().configured():
            return _redirect("/ui")  # nothing to log in to
        return _login_html()

    async def login(self, request: web.Request) -> web.Response:
        """Any key with read (or admin) scope logs in; the session keeps its scopes, so a
        read key's page shows no buttons and the API refuses their requests all the same."""
        keys = self.fleet.keyring()
        if not keys.configured():
            return _redirect("/ui")
        client = request.remote or ""
        if (wait := self.throttle.wait(client, time.monotonic())) > 0:
            seconds = math.ceil(wait)
            return _login_html(f"Too many wrong tokens: try again in {seconds} s.", status=429,
                               headers={"Retry-After": str(seconds)})
        given = str((await request.post()).get("token", ""))
        holder = keys.holder(given)
        if holder is None or not holder.grants("read"):
            if self.throttle.failed(client, time.monotonic()):
                # Once per run of failures, and never the token that was tried.
                log.warning(f"status page: {FREE} wrong tokens in a row from "
                            f"{client or 'an unknown address'}; its next tries are slowed down",
                            client=client)
            return _login_html("Wrong token.", status=401)
        self.throttle.succeeded(client)
        response = _redirect("/ui")
        response.set_cookie(SESSION_COOKIE, self.sessions.create(holder), httponly=True,
                            samesite="Strict", path="/", max_age=int(self.sessions.ttl))
        return response

    async def logout(self, request: web.Request) -> web.Response:
        self.sessions.drop(request.cookies.get(SESSION_COOKIE, ""))
        response = _redirect(LOGIN)
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def session(self, request: web.Request) -> web.Response:
        """The CSRF token of the caller's session (auth.py let only the logged-in through)."""
        csrf = self.sessions.csrf(request.cookies.get(SESSION_COOKIE, "")) or ""
        key: Holder = request[KEY]
        return web.json_response({"csrf": csrf, "csrf_header": CSRF_HEADER,
                                  "login": self.fleet.keyring().configured(),
                                  "key": None if key is OPEN else key.name,
                                  "admin": key.grants("admin")},
                                 headers=_NO_STORE)

    async def history(self, request: web.Request) -> web.Response:
        name = named_target(self.fleet, request.match_info["name"]).name
        try:
            since = float(request.query["since"]) if "since" in request.query else None
        except ValueError:
            raise web.HTTPBadRequest(reason="since must be a number (seconds since the "
                                            "epoch)") from None
        return web.json_response(self.fleet.history(name, since))

    async def tuning(self, request: web.Request) -> web.Response:
        name = named_target(self.fleet, request.match_info["name"]).name
        return web.json_response(self.fleet.tuning(name))

    async def logs(self, request: web.Request) -> web.Response:
        name = named_target(self.fleet, request.match_info["name"]).name
        try:
            lines = max(1, min(5000, int(request.query.get("lines", "200"))))
        except ValueError:
            raise web.HTTPBadRequest(reason="lines must be an integer") from None
        return web.json_response({"target": name, "time": time.time(),
                                  "lines": self.fleet.log_tail(name, lines)})

    async def requests(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "0")) or None
        except ValueError:
            raise web.HTTPBadRequest(reason="limit must be an integer") from None
        return web.json_response({"requests": self.fleet.recent_requests(limit)})


_NO_STORE = {"Cache-Control": "no-store"}


def _redirect(location: str) -> web.Response:
    # 303: the browser follows a POST's answer with a GET.
    return web.Response(status=303, headers={"Location": location, **_NO_STORE})


def _login_html(error: str = "", status: int = 200,
                headers: dict[str, str] | None = None) -> web.Response:
    page = (UI_DIR / "login.html").read_text(encoding="utf-8")
    note = f'<p class="error" role="alert">{error}</p>' if error else ""
    return web.Response(text=page.replace("<!--error-->", note), status=status,
                        content_type="text/html", headers={**_NO_STORE, **(headers or {})})
