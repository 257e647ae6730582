"""A retune under steady traffic through the proxy, with the real llama-server: the new
server starts beside the old one and takes over, and no request fails (docs/tuning.md,
"Restarts that cost no service"). An API restart of a target beside and of one set to
restart in place: neither fails a request, only the in-place one stops serving. A reload
that changes a serving target: its new server starts beside the old one, and a new server
that cannot start falls back to a restart in place with the runtime's own output."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import yaml

from tests.conftest import (
    in_flight,
    llama_target,
    plain_step_measured,
    wait_for,
    write_fleet,
)

REPEAT = ("def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
          "def volume(w, h, d):\n    return w * h * d\n\n"
          "# Repeat the three functions above exactly, then stop.\n")

FAST_TUNING = {"min_tokens": 200, "min_steps": 30, "cooldown": "0s", "max_wait": "1h",
               "reprobe": "1h"}


class Traffic:
    """`clients` threads sending completions through the proxy back to back, each with
    its own prompt (a counter in it), recording every answer's status and its time."""

    def __init__(self, proxy: str, clients: int = 2, model: str = "t", repeat: bool = False
                 ) -> None:
        self.proxy, self.model, self.repeat = proxy, model, repeat
        self.results: list[tuple[float, int, str]] = []  # (time answered, status, body start)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(clients)]

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(150)

    def _client(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            # `repeat`: text an n-gram drafter finds matches in (code asked to be copied).
            prompt = f"Request {i}-{n}. " + (REPEAT if self.repeat else "def area(w, h):\n")
            body = json.dumps({"model": self.model, "prompt": prompt,
                               "max_tokens": 48 if self.repeat else 24,
                               "temperature": 0}).encode()
            req = urllib.request.Request(f"{self.proxy}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    status, text = resp.status, resp.read()[:200].decode(errors="replace")
            except urllib.error.HTTPError as exc:
                status, text = exc.code, exc.read()[:200].decode(errors="replace")
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                status, text = 0, repr(exc)
            self.results.append((time.monotonic(), status, text))

    def failed(self) -> list[tuple[float, int, str]]:
        return [r for r in self.results if r[1] != 200]

    def count(self) -> int:
        return len(self.results)


def proxy_of(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]


def replace_steps(daemon) -> list[str]:
    return [e["data"]["replace"] for e in daemon.events("t") if e["kind"] == "replace"]


def test_a_retune_under_steady_proxy_traffic_fails_no_request(
        tmp_path, model, llama_server_bin, start_daemon):
    # min_gain 0: any length the model prefers to 4 is a retune.
    target = llama_target(model, llama_server_bin, tuning={**FAST_TUNING, "min_gain": "0%"},
                          speculation={"method": "ngram", "variant": "mod",
                                       "length": {"start": 4, "min": 2, "max": 16}})
    fleet = write_fleet(tmp_path, {"t": target})
    daemon = start_daemon(fleet)
    first = daemon.wait_state("t", "ready")
    plain_step_measured(daemon, "t")
    with Traffic(proxy_of(fleet), repeat=True) as traffic:
        # max_wait 1 h and a busy server: only a restart that costs no service is applied
        # now. n-gram drafts cannot be calibrated: the first decision comes from what
        # serving shows (another length, or speculation off).
        wait_for(lambda: "retired" in replace_steps(daemon), 300, "a retune beside the old server")
        served_before = traffic.count()
        wait_for(lambda: traffic.count() >= served_before + 4, 120, "requests on the new server")
    assert traffic.failed() == [], traffic.failed()[:3]
    tuning = [e for e in daemon.events("t") if e["kind"] == "tuning"
              and (e.get("data") or {}).get("new")]
    assert tuning and tuning[0]["data"]["old"] == "n=4" and tuning[0]["data"]["new"] != "n=4"
    assert replace_steps(daemon)[:3] == ["beside", "switched", "retired"]
    # The target never left `ready` (nor went through stopping or starting again).
    assert ("ready", "stopping") not in daemon.transitions("t")
    now = daemon.target("t")
    assert now["pid"] != first["pid"] and not psutil.pid_exists(first["pid"])
    assert now["endpoint"] != first["endpoint"]  # the runtime moved to another port
    cmd = psutil.Process(now["pid"]).cmdline()  # the new setting runs
    new = tuning[0]["data"]["new"]
    if new == "off":
        assert "--spec-type" not in cmd
    else:
        assert cmd[cmd.index("--spec-ngram-mod-n-max") + 1] == new[2:]
    assert now["restarts_by_reason"]["retune"] >= 1


def test_an_api_restart_beside_and_in_place_both_fail_no_request(
        tmp_path, model, llama_server_bin, start_daemon):
    """The same API restart under the same traffic, for a target that restarts beside the
    old server and one set to restart in place: neither fails a request (the proxy holds
    them through the in-place gap); only the in-place one stops serving for it."""
    fleet = write_fleet(tmp_path, {
        "t": llama_target(model, llama_server_bin),
        "u": llama_target(model, llama_server_bin,
                          restart={**llama_target(model, llama_server_bin)["restart"],
                                   "replace": "in_place"})})
    daemon = start_daemon(fleet)
    api = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]
    for name, expect in (("t", "retired"), ("u", "in_place")):
        daemon.wait_state(name, "ready")
        with Traffic(proxy_of(fleet), model=name) as traffic:
            wait_for(lambda: traffic.count() >= 4, 60, "traffic")
            pid = daemon.target(name)["pid"]
            urllib.request.urlopen(urllib.request.Request(
                f"{api}/v1/targets/{name}/restart", data=b"", method="POST"), timeout=10).read()
            wait_for(lambda n=name, p=pid: not psutil.pid_exists(p)
                     and daemon.target(n).get("state") == "ready", 120, "the restart")
            done = traffic.count()
            wait_for(lambda d=done: traffic.count() >= d + 4, 60, "requests after the restart")
        assert traffic.failed() == [], (name, traffic.failed()[:3])
        steps = [e["data"]["replace"] for e in daemon.events(name) if e["kind"] == "replace"]
        assert steps[-1] == expect, steps
    assert ("ready", "stopping") not in daemon.transitions("t")
    assert ("ready", "stopping") in daemon.transitions("u")


def changed_ctx(fleet: Path, ctx: str) -> None:
    doc = yaml.safe_load(fleet.read_text())
    args = doc["targets"]["t"]["args"]
    args[args.index("--ctx-size") + 1] = ctx
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_reload_that_changes_a_serving_target_fails_no_request(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    first = daemon.wait_state("t", "ready")
    with Traffic(proxy_of(fleet)) as traffic:
        wait_for(lambda: traffic.count() >= 4, 60, "traffic")
        changed_ctx(fleet, "1024")
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: "retired" in replace_steps(daemon), 120, "the changed target's server")
        done = traffic.count()
        wait_for(lambda: traffic.count() >= done + 4, 60, "requests on the new server")
    assert traffic.failed() == [], traffic.failed()[:3]
    assert replace_steps(daemon) == ["beside", "switched", "retired"]
    # One owner throughout: a new owner would start at `stopped`; the target's
    # one owner never left `ready`, and it reports the reload's new definition.
    assert daemon.transitions("t") == [("stopped", "starting"), ("starting", "loading"),
                                       ("loading", "ready")]
    # On the CPU the new server's requests wait for the old one's last (if it had any).
    switched = next(e["data"] for e in daemon.events("t") if e["kind"] == "replace"
                    and e["data"]["replace"] == "switched")
    assert switched["held"] == (switched["in_flight"] > 0)
    now = daemon.target("t")
    assert now["state"] == "ready" and now["pid"] != first["pid"]
    assert not psutil.pid_exists(first["pid"])
    cmdline = psutil.Process(now["pid"]).cmdline()
    assert cmdline[cmdline.index("--ctx-size") + 1] == "1024"
    assert now["endpoint"] != first["endpoint"]  # the configured port was the old one's


def test_a_changed_target_whose_new_server_cannot_start_is_restarted_in_place(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    first = daemon.wait_state("t", "ready")
    changed_ctx(fleet, "not-a-number")  # the fleet file takes it; llama-server does not
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "in_place" in replace_steps(daemon), 120, "the fallback to in place")
    event = [e for e in daemon.events("t") if e["kind"] == "replace"][-1]
    assert "restarting in place" in event["reason"] and event["data"]["output"]
    assert replace_steps(daemon) == ["beside", "in_place"]
    wait_for(lambda: not psutil.pid_exists(first["pid"]), 60, "the old server to stop")
    wait_for(lambda: daemon.target("t").get("state") in ("backoff", "failed"), 60,
             "the changed target's failure, shown as such")


def long_request(proxy: str, model: str, out: list) -> threading.Thread:
    """One completion of 200 tokens in a thread; (status, body start, when answered)
    appended to out."""
    def send() -> None:
        body = json.dumps({"model": model, "prompt": "Write a long story about a lighthouse.",
                           "max_tokens": 200, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{proxy}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                out.append((resp.status, resp.read()[:200].decode(errors="replace"),
                            time.time()))
        except urllib.error.HTTPError as exc:
            out.append((exc.code, exc.read()[:200].decode(errors="replace"), time.time()))
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_reload_that_restarts_a_target_in_place_holds_its_requests_and_finishes_those_in_flight(
        tmp_path, model, llama_server_bin, start_daemon):
    # Issue 30: the old supervisor was removed before it stopped (no drain): the request in
    # flight got 503 and those sent meanwhile 404 "no target 't'".
    restart = {**llama_target(model, llama_server_bin)["restart"], "replace": "in_place"}
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin,
                                                     restart=restart)})
    daemon = start_daemon(fleet)
    first = daemon.wait_state("t", "ready")
    long: list = []
    with Traffic(proxy_of(fleet)) as traffic:
        wait_for(lambda: traffic.count() >= 4, 60, "traffic")
        thread = long_request(proxy_of(fleet), "t", long)
        # In flight at the proxy: more than the two clients can have there at once.
        wait_for(lambda: in_flight(fleet, "t") == 3, 60, "the long request in flight")
        changed_ctx(fleet, "1024")
        daemon.signal(signal.SIGHUP)
        wait_for(lambda: (t := daemon.target("t")).get("state") == "ready"
                 and t.get("pid") != first["pid"], 120, "the changed target's new server")
        done = traffic.count()
        wait_for(lambda: traffic.count() >= done + 4, 60, "requests on the new server")
        thread.join(120)
    assert traffic.failed() == [], traffic.failed()[:3]
    assert long and long[0][0] == 200, long
    # Finished on the old server, not cut and resent: answered before the new one was ready.
    states = [e for e in daemon.events("t") if e["kind"] == "state"]
    stopped = next(i for i, e in enumerate(states) if e.get("old") == "ready")
    new_ready = next(e["time"] for e in states[stopped:] if e.get("new") == "ready")
    assert long[0][2] < new_ready, (long[0], new_ready)
    assert replace_steps(daemon) == ["in_place"]
    cmdline = psutil.Process(daemon.target("t")["pid"]).cmdline()
    assert cmdline[cmdline.index("--ctx-size") + 1] == "1024"


def test_a_reload_while_an_on_demand_target_loads_serves_the_request_that_loads_it(
        tmp_path, model, llama_server_bin, start_daemon):
    # Issue 30: that request got 503 "is stopping: changed in the fleet file" and the new
    # target was left unloaded.
    fleet = write_fleet(tmp_path, {"t": llama_target(model, llama_server_bin,
                                                     start="on_demand")})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "unloaded")
    answers: list = []
    thread = long_request(proxy_of(fleet), "t", answers)
    wait_for(lambda: daemon.target("t").get("state") in ("starting", "loading"), 30,
             "the load the request started")
    changed_ctx(fleet, "1024")
    daemon.signal(signal.SIGHUP)
    thread.join(180)
    assert answers and answers[0][0] == 200, answers
    now = daemon.target("t")
    assert now["state"] == "ready", now
    cmdline = psutil.Process(now["pid"]).cmdline()
    assert cmdline[cmdline.index("--ctx-size") + 1] == "1024"
