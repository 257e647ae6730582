"""The status page's side of the API listener without a browser (tests/api/test_ui_browser.py
drives the pages): the login and its cookie, CSRF and cross-site refusals, and what the
pages read: history, log tail, requests. Real daemon, real llama-server."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

import yaml

from supervisor.api.throttle import FREE
from tests.conftest import llama_target, wait_for, write_fleet

TOKEN = "ui-t0ken"
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n"


class Client:
    """Plain HTTP to one listener, redirects not followed, cookies kept by hand."""

    def __init__(self, address: str) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.cookie = ""

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        sent = dict(headers or {})
        if self.cookie:
            sent["Cookie"] = self.cookie
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        data = resp.read()
        got = {k.lower(): v for k, v in resp.getheaders()}
        conn.close()
        return resp.status, got, data

    def json(self, path: str) -> Any:
        status, _, body = self.call("GET", path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)


def fleet(tmp_path, model, binary, token: bool = True):
    """One n-gram target; with a token, kept in a file as a sysadmin would."""
    extra: dict[str, Any] = {}
    if token:
        (tmp_path / "token").write_text(TOKEN + "\n")
        extra["api_token"] = {"file": str(tmp_path / "token")}
    return write_fleet(tmp_path, {"alpha": llama_target(
        model, binary, speculation={"method": "ngram"})}, **extra)


def listeners(path) -> tuple[str, str]:
    daemon = yaml.safe_load(path.read_text())["daemon"]
    return daemon["api"], daemon["proxy"]["listen"]


def complete(proxy: str, token: str | None) -> dict[str, Any]:
    client = Client(proxy)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, _, body = client.call("POST", "/v1/completions", json.dumps(
        {"model": "alpha", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}).encode(),
        headers)
    assert status == 200, body
    return json.loads(body)


def test_login_cookie_csrf_and_what_the_pages_read(tmp_path, model, llama_server_bin,
                                                    start_daemon):
    path = fleet(tmp_path, model, llama_server_bin)
    api, proxy = listeners(path)
    daemon = start_daemon(path)
    daemon.wait_state("alpha", "ready")
    web = Client(api)

    # Without a session: the pages send the browser to the login page, the rest is 401.
    for page in ("/", "/ui"):
        status, headers, _ = web.call("GET", page)
        assert status == 302 and headers["location"] == "/ui/login"
    status, _, body = web.call("GET", "/ui/login")
    assert status == 200 and b'name="token"' in body
    # The tab's icon, also before the login (it was a 404 once logged in).
    status, headers, body = web.call("GET", "/favicon.ico")
    assert status == 200 and headers["content-type"].startswith("image/svg+xml")
    assert body.startswith(b"<svg") and b'href="/favicon.ico"' in web.call("GET", "/ui/login")[2]
    for p in ("/ui/static/app.js", "/ui/session", "/v1/requests", "/v1/targets/alpha/history",
              "/v1/targets/alpha/logs"):
        assert web.call("GET", p)[0] == 401, p

    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _, body = web.call("POST", "/ui/login", b"token=wrong", form)
    assert status == 401 and b"Wrong token." in body
    status, headers, _ = web.call("POST", "/ui/login",
                                  urllib.parse.urlencode({"token": TOKEN}).encode(), form)
    assert status == 303 and headers["location"] == "/ui"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    web.cookie = cookie.split(";", 1)[0]

    status, _, body = web.call("GET", "/ui")
    assert status == 200 and b"/ui/static/app.js" in body
    assert web.call("GET", "/")[1]["location"] == "/ui"
    assert web.call("GET", "/ui/static/vendor/uPlot.iife.min.js")[0] == 200
    session = web.json("/ui/session")
    csrf, header = session["csrf"], session["csrf_header"]
    assert csrf and session["login"] is True

    # A state change carried by the cookie needs the CSRF header; cross-site is refused.
    status, _, body = web.call("POST", "/v1/targets/alpha/restart")
    assert status == 403 and header.encode() in body
    status, _, _ = web.call("POST", "/v1/targets/alpha/restart",
                            headers={header: csrf, "Origin": "http://evil.example"})
    assert status == 403
    pid = daemon.target("alpha")["pid"]
    status, _, _ = web.call("POST", "/v1/targets/alpha/restart",
                            headers={header: csrf, "Origin": f"http://{api}"})
    assert status == 202
    wait_for(lambda: (t := daemon.target("alpha")).get("state") == "ready" and t["pid"] != pid,
             60, "the restart asked with the session")

    # What the pages read: the requests, the history, the log tail.
    out = complete(proxy, TOKEN)
    assert out["choices"][0]["text"]
    [entry] = web.json("/v1/requests")["requests"]
    timings = out["timings"]  # what llama-server said about this request
    assert entry["target"] == "alpha" and entry["status"] == 200
    assert entry["completion_tokens"] == timings["predicted_n"] == 24
    # The whole prompt, as OpenAI's usage counts it, and again when the runtime's cache
    # served most of it (timings.prompt_n then counts only what it evaluated).
    assert entry["prompt_tokens"] == out["usage"]["prompt_tokens"] > 0
    again = complete(proxy, TOKEN)
    second = web.json("/v1/requests")["requests"][0]
    assert second["prompt_tokens"] == again["usage"]["prompt_tokens"] == entry["prompt_tokens"]
    assert again["timings"]["prompt_n"] < second["prompt_tokens"]
    assert second["cached_tokens"] == again["timings"]["cache_n"] > 0
    assert entry.get("draft_tokens") == timings.get("draft_n")  # present when it drafted
    assert entry.get("accepted_tokens") == timings.get("draft_n_accepted")
    assert entry["tokens_per_second"] == round(timings["predicted_per_second"], 2)
    assert entry["duration_s"] > 0
    history = wait_for(lambda: (h := web.json("/v1/targets/alpha/history"))["samples"]
                       and h["samples"][-1]["tokens_per_second"] is not None and h,
                       30, "a history sample with the request's throughput")
    kinds = [(m["kind"], m.get("state")) for m in history["marks"]]
    assert kinds[0] == ("state", "starting")  # the daemon's start is the first mark
    # The restart started the new server beside the old one: that is its mark.
    restart_mark = [m for m in history["marks"] if m["kind"] == "replace"][-1]
    assert "restart requested through the API" in restart_mark["reason"]
    assert restart_mark["data"]["replace"] == "beside"
    logs = web.json("/v1/targets/alpha/logs?lines=5")
    assert len(logs["lines"]) == 5
    assert any("llama" in line or "srv" in line or "slot" in line
               for line in web.json("/v1/targets/alpha/logs?lines=400")["lines"])
    # On disk, for the next daemon.
    assert (tmp_path / "state" / "history" / "alpha.jsonl").stat().st_size > 0

    status, headers, _ = web.call("POST", "/ui/logout")
    assert status == 303 and headers["location"] == "/ui/login"
    assert web.call("GET", "/ui/session")[0] == 401  # the session is gone

    # Guessing is slowed down: the first wrong tokens in a row are answered at once, then
    # the next try is refused for a while (seconds: long past these few requests), the
    # right token too (docs/ui.md).
    for _ in range(FREE):
        assert web.call("POST", "/ui/login", b"token=guess", form)[0] == 401
    for token in ("guess", TOKEN):
        status, headers, body = web.call("POST", "/ui/login",
                                         urllib.parse.urlencode({"token": token}).encode(), form)
        assert status == 429 and int(headers["retry-after"]) >= 1, (status, headers)
        assert b"Too many wrong tokens" in body


def test_without_a_token_the_pages_need_no_login_but_cross_site_writes_are_refused(
        tmp_path, model, llama_server_bin, start_daemon):
    path = fleet(tmp_path, model, llama_server_bin, token=False)
    api, _ = listeners(path)
    daemon = start_daemon(path)
    daemon.wait_state("alpha", "ready")
    web = Client(api)
    assert web.call("GET", "/ui")[0] == 200
    assert web.call("GET", "/ui/login")[1]["location"] == "/ui"
    assert web.json("/ui/session")["login"] is False
    status, _, body = web.call("POST", "/v1/targets/alpha/restart",
                               headers={"Origin": "http://evil.example"})
    assert status == 403 and b"cross-site" in body
    status, _, _ = web.call("POST", "/v1/targets/alpha/restart",
                            headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403
    assert web.call("POST", "/v1/targets/alpha/restart")[0] == 202  # curl: no Origin
