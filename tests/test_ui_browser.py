"""The status page in a real headless browser: Debian's chromium driven by Playwright's
Python package through `executable_path` (no browser download), against a real daemon
with real llama-server targets. Screenshots of the fleet page and a target page are
written to docs/ when SPECFLEET_SCREENSHOTS is set to that directory (how docs/ui-*.png
were made), else into the test's directory."""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import llama_target, wait_for, write_fleet
from tests.test_live_tuning import CODE, FAST_TUNING, drive, tuning_events

pytestmark = pytest.mark.live

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "br0wser-t0ken"


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if CHROMIUM is None:
        pytest.skip("no chromium: apt-get install chromium")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def proxy_completion(fleet: Path, model: str) -> dict:
    daemon = yaml.safe_load(fleet.read_text())["daemon"]
    body = json.dumps({"model": model, "prompt": CODE, "max_tokens": 32,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://{daemon['proxy']['listen']}/v1/completions", body,
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def test_the_status_page_in_a_browser(tmp_path, model, llama_server_bin, start_daemon, browser):
    (tmp_path / "token").write_text(TOKEN)
    fast = {"metrics_interval": "0.5s", "interval": "0.5s", "timeout": "2s", "failures": 4,
            "start_timeout": "60s"}
    fleet = write_fleet(tmp_path, {
        "coder": llama_target(model, llama_server_bin, speculation={"method": "ngram"},
                              tuning=dict(FAST_TUNING), health=fast),
        "chat": llama_target(model, llama_server_bin, health=fast)},
        api_token={"file": str(tmp_path / "token")})
    api = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]
    daemon = start_daemon(fleet)
    daemon.wait_state("coder", "ready")
    daemon.wait_state("chat", "ready")
    shots = Path(os.environ.get("SPECFLEET_SCREENSHOTS") or tmp_path)
    page = browser.new_page(viewport={"width": 1400, "height": 900})

    # Without the token: the login page and nothing else.
    page.goto(f"{api}/")
    assert page.url == f"{api}/ui/login"
    assert page.evaluate("fetch('/v1/targets').then(r => r.status)") == 401
    assert page.evaluate("fetch('/ui/static/app.js').then(r => r.status)") == 401
    page.fill("#token", "wrong")
    page.click("#login")
    assert page.locator(".error").inner_text() == "Wrong token."

    # Logged in: the fleet, live.
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_url(f"{api}/ui")
    for name in ("coder", "chat"):
        page.locator(f'tr[data-target="{name}"] [data-state="ready"]').wait_for(timeout=30_000)
    assert page.locator("#live.on").count() == 1
    page.screenshot(path=str(shots / "ui-fleet.png"), full_page=True)

    # A restart clicked in the page: the state sequence, live, and the new pid.
    old_pid = daemon.target("chat")["pid"]
    page.click('tr[data-target="chat"] button.restart')
    sequence = page.locator("#seq-chat")
    sequence.filter(has_text="old stopped").wait_for(timeout=60_000)
    # The new server starts beside the old one (the proxy is on): no state changes.
    assert sequence.inner_text() == "restart asked → loading beside → switched → old stopped"
    new_pid = daemon.target("chat")["pid"]
    assert new_pid != old_pid
    page.locator(f'tr[data-target="chat"] td.pid:text-is("{new_pid}")').wait_for(timeout=10_000)

    # Traffic: a request through the proxy (the activity list) and enough to the runtime for
    # a tuning decision (a mark on the target's charts).
    assert proxy_completion(fleet, "coder")["choices"][0]["text"]
    drive(daemon, "coder", lambda: tuning_events(daemon, "coder"), CODE)
    decision = tuning_events(daemon, "coder")[0]
    wait_for(lambda: daemon.target("coder").get("state") == "ready", 60, "coder back")

    def samples_after_the_decision() -> bool:
        req = urllib.request.Request(f"{api}/v1/targets/coder/history",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            samples = json.loads(resp.read())["samples"]
        return bool(samples) and samples[-1]["t"] > decision["time"]
    # Traffic on: its counters are read after the decision too (the mark inside the chart).
    assert proxy_completion(fleet, "coder")["choices"][0]["text"]
    wait_for(samples_after_the_decision, 30, "history after the decision")
    page.goto(f"{api}/ui#/target/coder")
    chart = page.locator('.chart[data-series="tokens_per_second"]')
    chart.wait_for(timeout=30_000)
    assert int(chart.get_attribute("data-points") or 0) > 0
    tuning = page.locator('#marks tr[data-kind="tuning"]')
    assert tuning.count() >= 1 and decision["reason"] in tuning.first.inner_text()
    # Hovering the decision's line on a chart shows its numbers.
    x, y = page.evaluate("""(t) => {
        const u = S.charts[0], box = u.over.getBoundingClientRect();
        return [box.left + u.valToPos(t, "x"), box.top + box.height / 2]; }""", decision["time"])
    page.mouse.move(x, y)
    tip = page.locator("#tip")
    tip.wait_for(state="visible", timeout=5_000)
    assert decision["reason"] in tip.inner_text() and "action " in tip.inner_text()
    page.mouse.move(0, 0)
    page.locator("#log").filter(has_text="srv").wait_for(timeout=10_000)
    page.screenshot(path=str(shots / "ui-target.png"), full_page=True)

    page.goto(f"{api}/ui#/requests")
    row = page.locator('tr.request[data-target="coder"]')
    row.first.wait_for(timeout=10_000)
    assert "200" in row.first.inner_text()

    # A bad fleet file reloaded from the page: its problems, with file:line; nothing changes.
    good = fleet.read_text()
    fleet.write_text(good.replace("version: 1", "version: 1\nbogus_key: 3"))
    page.goto(f"{api}/ui#/")
    page.click("#reload")
    problems = page.locator("#problems")
    problems.wait_for(timeout=30_000)
    assert f"{fleet}:2" in problems.inner_text() and "bogus_key" in problems.inner_text()
    assert daemon.target("coder")["state"] == "ready"
    page.goto(f"{api}/ui#/daemon")  # the daemon page keeps the rejected reload in view
    page.locator(".problems").filter(has_text="bogus_key").wait_for(timeout=10_000)
    fleet.write_text(good)
    page.goto(f"{api}/ui#/")
    page.click("#reload")
    page.locator("#reload-result").filter(has_text="reloaded").wait_for(timeout=30_000)
    assert page.locator("#problems").count() == 0


def test_the_page_keeps_working_while_events_stream(tmp_path, model, llama_server_bin,
                                                    start_daemon, browser):
    """Without a token (loopback only) no login is asked; the event stream stays open."""
    fleet = write_fleet(tmp_path, {"solo": llama_target(model, llama_server_bin)})
    api = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]
    daemon = start_daemon(fleet)
    daemon.wait_state("solo", "ready")
    page = browser.new_page()
    page.goto(f"{api}/")
    assert page.url == f"{api}/ui"
    page.locator('tr[data-target="solo"] [data-state="ready"]').wait_for(timeout=30_000)
    assert page.locator("#logout").is_hidden()
    done = threading.Event()
    page.on("console", lambda msg: done.set() if msg.type == "error" else None)
    page.goto(f"{api}/ui#/events")
    urllib.request.urlopen(urllib.request.Request(f"{api}/v1/targets/solo/restart", b"",
                                                  method="POST"), timeout=30).close()
    page.locator("#events").filter(has_text="ready").wait_for(timeout=60_000)
    assert not done.is_set()  # no script errors
