"""The status page in a real headless browser: Debian's chromium driven by Playwright's
Python package through `executable_path` (no browser download), against a real daemon
with real llama-server targets. Screenshots of the fleet page and a target page are
written to docs/ when SPECFLEET_SCREENSHOTS is set to that directory (how docs/ui-*.png
were made), else into the test's directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import llama_target, plain_step_measured, wait_for, write_fleet
from tests.tuning.test_live_tuning import CODE, FAST_TUNING, drive, tuning_events

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


def api_json(api: str, path: str) -> dict:
    req = urllib.request.Request(f"{api}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def cli_labels(fleet: Path, name: str) -> dict[str, str]:
    """The labels `specfleet status --target` prints (its fixed layout, statusview.py)."""
    out = subprocess.run([sys.executable, "-m", "supervisor", "status", str(fleet), "--target",
                          name], capture_output=True, text=True, timeout=60, check=True).stdout
    lines = {ln.split()[0]: ln.strip() for ln in out.splitlines()[1:6] if ln.strip()}
    spec = re.match(r"speculation\s+(.*?)\s+accepted (.*?)\s+speed (.*)$", lines["speculation"])
    assert spec is not None, out
    rate, length = spec[2].split(" ", 1) if spec[2] != "-" else ("-", "-")
    return {"Speculation": spec[1], "Acceptance": rate, "Accepted length": length,
            "Speed": spec[3], "Memory": lines["memory"].split(None, 1)[1],
            "Restarts": lines["restarts"].split(None, 1)[1]}


def page_labels(page) -> dict[str, str]:
    return {k: page.locator(f'#facts dd[data-fact="{k}"]').inner_text().replace("–", "-")
            for k in ("Speculation", "Acceptance", "Accepted length", "Speed", "Memory",
                      "Restarts")}


def settled_tuning(api: str, name: str) -> dict:
    """The target's "why", once two reads a second apart agree (the last request's counters
    reach the tuner at the next metrics scrape and move the mix)."""
    last: dict = {}
    for _ in range(30):
        now = api_json(api, f"/v1/targets/{name}/tuning")
        if now == last:
            return now
        last = now
        time.sleep(1)
    raise AssertionError(f"{name}'s tuning view never held still: {last}")


def same_labels_as_the_cli(page, api: str, fleet: Path, name: str) -> None:
    """Page, CLI, page: equal once the page did not change across the CLI's read (the
    monitor's readings move between reads; nothing else runs)."""
    seen = []
    for _ in range(10):
        page.goto(f"{api}/ui#/")
        page.goto(f"{api}/ui#/target/{name}")
        page.locator("#facts").wait_for(timeout=10_000)
        before, cli = page_labels(page), cli_labels(fleet, name)
        page.reload()
        page.locator("#facts").wait_for(timeout=10_000)
        if before == page_labels(page):
            # Each shows what the other does, "-" included (a retune may just have
            # restarted the server: then neither has a speed yet).
            assert before == cli
            return
        seen.append(before)
        page.wait_for_timeout(1_000)
    raise AssertionError(f"the page's labels never held still: {seen}")


def test_the_status_page_in_a_browser(tmp_path, model, llama_server_bin, start_daemon, browser):
    (tmp_path / "token").write_text(TOKEN)
    fast = {"metrics_interval": "0.5s", "interval": "0.5s", "timeout": "2s", "failures": 4,
            "start_timeout": "60s"}
    fleet = write_fleet(tmp_path, {
        # A draft as large as the target (its own GGUF) loses to off on any machine, so
        # there is a decision to show once serving measured its drafted steps. (An n-gram
        # target's first decision depends on the machine: on one EPYC the model kept n=4.)
        "coder": llama_target(model, llama_server_bin, speculation={
            "method": "draft", "draft": model, "length": {"start": 4, "min": 1, "max": 8}},
            tuning={**FAST_TUNING, "min_gain": "0%"}, health=fast),
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
    # A guesser is slowed down: after five wrong tokens in a row, the next try waits.
    for _ in range(4):
        page.fill("#token", "wrong")
        page.click("#login")
    assert page.locator(".error").inner_text() == "Wrong token."
    page.fill("#token", TOKEN)
    page.click("#login")
    assert page.locator(".error").inner_text().startswith("Too many wrong tokens: try again in")
    logged = daemon.stderr_path.read_text(errors="replace")
    assert logged.count("wrong tokens in a row") == 1 and TOKEN not in logged
    page.wait_for_timeout(2_100)  # the first lock: 2 s

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
    # tuning decisions (marks on the target's charts) and the model's predictions (the "why").
    plain_step_measured(daemon, "coder")
    assert proxy_completion(fleet, "coder")["choices"][0]["text"]
    drive(daemon, "coder", lambda: api_json(api, "/v1/targets/coder/tuning")["decisions"], CODE)
    # The first decision (the calibration's events before it are tuning events too).
    decision = next(e for e in tuning_events(daemon, "coder") if e["data"].get("new"))
    wait_for(lambda: daemon.target("coder").get("state") == "ready", 60, "coder back")

    def samples_after_the_decision() -> bool:
        samples = api_json(api, "/v1/targets/coder/history")["samples"]
        return bool(samples) and samples[-1]["t"] > decision["time"]
    # Traffic on: its counters are read after the decision too (the mark inside the chart).
    assert proxy_completion(fleet, "coder")["choices"][0]["text"]
    wait_for(samples_after_the_decision, 30, "history after the decision")
    page.goto(f"{api}/ui#/target/coder")
    chart = page.locator('.chart[data-series="tokens_per_second"]')
    chart.wait_for(timeout=30_000)
    assert int(chart.get_attribute("data-points") or 0) > 0
    tuning = page.locator('#marks tr[data-kind="tuning"]')
    assert any(decision["reason"] in mark.inner_text() for mark in tuning.all())
    # Why this setting: every setting's predicted speedup as a bar, the running one marked,
    # the cost of a step, each class's acceptance, each decision with its reason, what it
    # expected and what its restart cost (the API's numbers, as they are).
    why = settled_tuning(api, "coder")
    page.reload()  # drawn from the same answer as `why`
    page.locator("#why rect.bar").first.wait_for(timeout=10_000)
    bars = page.locator("#why rect.bar")
    shown = {b.get_attribute("data-setting"): float(b.get_attribute("data-speedup") or 0)
             for b in bars.all()}
    assert set(shown) == {p["setting"] for p in why["predicted"]} and "off" in shown
    running = [p["setting"] for p in why["predicted"] if p["running"]]
    assert page.locator("#why rect.bar.running").get_attribute("data-setting") == running[0]
    assert page.locator("#why-summary").inner_text().startswith(why["summary"])
    assert "A plain step" in page.locator("#why-cost").inner_text()
    assert page.locator("#why-classes tr.class").count() == len(why["classes"]) >= 1
    first = page.locator("#decisions tr.decision").last  # newest first: the first decision
    assert decision["reason"] in first.inner_text() and why["decisions"][0]["cost"] in \
        first.inner_text() and why["decisions"][0]["expectation"] in first.inner_text()
    # Units on the axes; a chart with nothing to show says so.
    assert page.locator('.chart[data-series="acceptance_rate"] h4').inner_text() == \
        "Acceptance (%)"
    assert page.evaluate("S.chartBy.tokens_per_second.axes[1].label") == "tok/s"
    # Hovering the decision's line on a chart shows its numbers.
    chart.scroll_into_view_if_needed()
    x, y = page.evaluate("""(t) => {
        const u = S.chartBy.tokens_per_second, box = u.over.getBoundingClientRect();
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

    # A target without speculation: no "why", and charts that say they have no data.
    page.goto(f"{api}/ui#/target/chat")
    page.locator('.chart[data-series="acceptance_rate"] .no-data').wait_for(timeout=10_000)
    assert "Not tuned" in page.locator("#why").inner_text()

    # A view left while its answer is slow does not draw over the view that followed it
    # (CI once saw the fleet table come back over a target's page and stay there).
    page.goto(f"{api}/ui#/target/chat")
    page.locator("#facts").wait_for(timeout=10_000)
    page.evaluate("""() => { const fetched = window.fetch;
        window.fetch = (url, opts) => url === "/v1/targets"
            ? new Promise((done) => setTimeout(done, 1500)).then(() => fetched(url, opts))
            : fetched(url, opts); }""")
    page.evaluate("location.hash = '#/'")
    page.evaluate("location.hash = '#/target/coder'")
    page.locator("#facts").wait_for(timeout=10_000)
    page.wait_for_timeout(2_500)  # the fleet's answer came 1 s ago
    assert page.locator("#fleet").count() == 0
    assert page.locator("h2").first.inner_text() == "coder"
    page.reload()

    # The page and `specfleet status` show the same labels for the same target.
    assert proxy_completion(fleet, "coder")["choices"][0]["text"]
    same_labels_as_the_cli(page, api, fleet, "coder")

    # A phone: every page fits its width, the fleet as cards with every label on screen.
    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    phone.context.add_cookies(page.context.cookies())
    phone.goto(f"{api}/ui#/")
    phone.locator('tr[data-target="coder"] [data-state="ready"]').wait_for(timeout=30_000)
    for view in ("#/", "#/target/coder", "#/requests", "#/events", "#/daemon"):
        phone.goto(f"{api}/ui{view}")
        phone.wait_for_load_state("networkidle")
        phone.wait_for_timeout(300)
        wide = phone.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"{view} is {wide} px wide at 390 px"
        if view == "#/":
            phone.screenshot(path=str(shots / "ui-phone-fleet.png"), full_page=True)
        if view == "#/target/coder":
            phone.screenshot(path=str(shots / "ui-phone-target.png"), full_page=True)
            # Words stay whole in the marks' cards ("daemon started" once broke into
            # "dae / mon / start / ed"): its text lies on one line.
            lines = phone.evaluate("""() => {
                const cell = [...document.querySelectorAll('#marks td[data-label="Reason"]')]
                    .find((td) => td.textContent === "daemon started");
                const range = document.createRange(); range.selectNodeContents(cell);
                return range.getClientRects().length; }""")
            assert lines == 1
            # Each chart fills its card (it was a fixed 440 px).
            widths = phone.evaluate("""() => [...document.querySelectorAll('.chart[data-series]')]
                .filter((c) => c.querySelector('canvas'))
                .map((c) => [c.clientWidth, c.querySelector('canvas').getBoundingClientRect().width])""")
            assert widths and all(card - 16 - 2 <= canvas <= card for card, canvas in widths), widths
            # The why charts' text is read on the phone too (it once rendered at 6 px).
            sizes = phone.evaluate("""() => [...document.querySelectorAll('#why svg text')]
                .map((t) => t.getBoundingClientRect().height)""")
            assert sizes and min(sizes) >= 9, sizes
        if view == "#/daemon":
            facts = phone.locator("#daemon").inner_text()
            assert str(fleet) in facts and not re.search(r"\b\d{10}\.\d+\b", facts), facts
            gpus = phone.locator("#gpus").inner_text()  # a table, or why there is none
            assert "{" not in gpus and gpus.strip(), gpus
    phone.goto(f"{api}/ui#/")
    card = phone.locator('#fleet tr[data-target="coder"]')
    card.wait_for(timeout=10_000)
    for label in ("Accepted", "Speed", "Memory", "Restart"):
        box = card.locator(f'td[data-label="{label}"]').bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, label
    header, logout = phone.locator("header").bounding_box(), \
        phone.locator("#logout button").bounding_box()
    assert header and logout and logout["y"] + logout["height"] <= header["y"] + header["height"]
    phone.close()

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
    assert page.locator("#events th").all_inner_texts() == ["Time", "Target", "Kind", "Change",
                                                             "Reason"]
    assert not done.is_set()  # no script errors
