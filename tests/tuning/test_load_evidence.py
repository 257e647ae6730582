"""Evidence by load (tuning/load.py): the window per concurrency bucket, its busy time and
throughput, fed by the runtime's gauge and the proxy's in-flight peak; shown by status,
the API and /metrics; and live, on a real llama-server serving one and then four clients."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import urllib.request

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.api.promexport import registry_for
from supervisor.config.schema import Target
from supervisor.plugin.backend import MetricsSample
from supervisor.supervision.requests import ProxyRequests
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.load import LABELS, LoadWindows, bucket_of
from supervisor.tuning.window import Delta
from tests.conftest import REPO, llama_target, wait_for, write_fleet


@pytest.mark.parametrize(("running", "label"), [
    (0, "1"), (1, "1"), (2, "2-3"), (3, "2-3"), (4, "4-7"), (7, "4-7"), (8, "8+"), (64, "8+")])
def test_every_load_has_one_bucket(running, label):
    assert bucket_of(running) == label


def delta(t: float, tokens: int, drafts: int = 10, accepted: int = 20) -> Delta:
    return Delta(time=t, drafts=drafts, draft_tokens=4 * drafts, accepted=accepted,
                 per_position=(drafts, accepted - drafts), tokens=tokens, seconds=tokens / 50)


def test_windows_keep_evidence_busy_time_and_throughput_apart_per_bucket():
    w = LoadWindows(max_age=100)
    for t in range(1, 5):  # 4 s at one request: 50 tokens/s
        w.busy(t, 1, 1.0)
    w.add(delta(4, 200), 1)
    for t in range(5, 7):  # 2 s at five requests: 300 tokens in all
        w.busy(t, 5, 1.0)
    w.add(delta(6, 300, accepted=10), 5)
    stats = w.stats()
    assert list(stats) == ["1", "4-7"]
    assert stats["1"].throughput == 50 and stats["4-7"].throughput == 150
    assert stats["1"].window.acceptance_rate == 0.5 and stats["4-7"].window.acceptance_rate == 0.25
    view = w.view()
    assert view["1"]["time_share"] == pytest.approx(4 / 6, abs=1e-4)
    assert view["4-7"]["busy_seconds"] == 2.0
    w.busy(200, 1, 1.0)  # long after: the old busy time has aged out
    w.add(delta(200, 50), 1)
    assert w.stats()["1"].busy_seconds == 1.0
    w.clear()
    assert w.stats() == {}


def test_busy_time_is_booked_with_the_tokens_it_produced():
    # One request ended (its tokens counted), the next has run 3 s with nothing counted yet:
    # those 3 s belong to tokens still to come, not to the finished request's.
    w = LoadWindows()
    w.busy(2, 1, 2.0)
    w.add(delta(2, 100), 1)
    for t in (3, 4, 5):
        w.busy(t, 1, 1.0)
    assert w.stats()["1"].throughput == 50
    w.add(Delta(time=5, drafts=0, draft_tokens=0, accepted=0, per_position=(), tokens=0,
                seconds=0), 1)  # counters that moved without tokens book nothing
    assert w.stats()["1"].busy_seconds == 2.0
    w.add(delta(6, 50), 1)
    assert w.stats()["1"].busy_seconds == 5.0 and w.stats()["1"].throughput == 30
    w.clear()
    w.add(delta(7, 10), 1)
    assert w.stats()["1"].busy_seconds == 0  # cleared: nothing left to book


def test_idle_intervals_count_no_busy_time():
    w = LoadWindows()
    w.busy(1, 0, 1.0)
    w.add(delta(1, 10), 0)  # tokens from a request that ended between scrapes: load 1
    assert w.stats()["1"].busy_seconds == 0


def test_the_tuner_files_each_sample_at_the_most_requests_seen_by_gauge_or_proxy():
    target = Target(name="t", backend="llamacpp", model="/m.gguf", port=1,
                    speculation={"method": "ngram", "variant": "mod"})
    tuner = AutoTuner(target, LlamaCppBackend(target), None, lambda *a, **k: None)
    counters = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "tokens_predicted": 0}

    def sample(running: int, tokens: int) -> MetricsSample:
        for key, step in (("drafts", 5), ("draft_tokens", 20), ("accepted_tokens", 10),
                          ("tokens_predicted", tokens)):
            counters[key] += step
        return MetricsSample(**counters, requests_processing=running,
                             tokens_predicted_seconds=counters["tokens_predicted"] / 40)

    tuner.observe(sample(1, 40))
    tuner.observe(sample(0, 40))  # finished since: still the load of one request
    tuner.observe(sample(0, 40), proxy_peak=3)  # the gauge missed them; the proxy did not
    assert set(tuner.by_load.stats()) == {"1", "2-3"}
    assert tuner.by_load.stats()["2-3"].window.tokens == 40


def test_proxy_peak_is_the_most_in_flight_since_the_last_take():
    async def scenario() -> list[int]:
        book = ProxyRequests()
        async with book.relaying(), book.relaying():
            pass
        first = book.take_peak()
        async with book.relaying():
            second = book.take_peak()
        third = book.take_peak()  # that request was still in flight when this interval began
        return [first, second, third, book.take_peak()]

    assert asyncio.run(scenario()) == [2, 1, 1, 0]


def test_after_a_switch_to_a_new_server_the_old_ones_requests_are_not_its_load_or_busy_time():
    # steady_load run 3: the requests the old server still finished after a restart beside
    # were booked as the new server's busy time, at 8+, against its tokens only: its
    # baseline read 45 tokens/s where the server did about 120.
    async def scenario() -> tuple[int, dict[int, float], int, dict[int, float]]:
        book = ProxyRequests()
        old_done = asyncio.Event()

        async def old_request() -> None:
            async with book.relaying():
                await old_done.wait()
        old = [asyncio.create_task(old_request()) for _ in range(3)]
        await asyncio.sleep(0.05)
        book.switch_route()  # the time up to here was the old server's, at 3
        assert 3 in book.take_busy() and book.take_peak() == 0
        async with book.relaying():  # one request on the new server, beside the 3 draining
            await asyncio.sleep(0.1)
        peak, busy = book.take_peak(), book.take_busy()
        old_done.set()
        await asyncio.gather(*old)
        return peak, busy, book.in_flight, book.take_busy()

    peak, busy, in_flight, after = asyncio.run(scenario())
    assert peak == 1 and set(busy) == {1} and busy[1] >= 0.1
    assert in_flight == 0 and after == {}  # the old route's end books nothing either


def test_metrics_and_status_show_the_buckets():
    status = {"name": "t", "backend": "llamacpp", "state": "ready", "restarts": 0,
              "by_load": {"1": {"throughput": 50.0, "acceptance_rate": 0.5, "time_share": 0.6,
                                "tokens_per_second": 50.0},
                          "4-7": {"throughput": 120.0, "acceptance_rate": 0.25,
                                  "time_share": 0.4, "tokens_per_second": 30.0}}}

    class Fleet:
        fleet_file = "f.yaml"

        def target_statuses(self):
            return [status]

    from prometheus_client import generate_latest
    text = generate_latest(registry_for(Fleet())).decode()
    assert 'specfleet_target_throughput_by_load{backend="llamacpp",load="4-7",target="t"} 120.0' \
        in text
    assert 'specfleet_target_acceptance_rate_by_load{backend="llamacpp",load="1",target="t"} 0.5' \
        in text
    from supervisor.cli.statusview import render_target
    shown = render_target(status, None)
    assert "by load" in shown and "4-7" in shown and "120.0" in shown and "25%" in shown
    assert LABELS == ("1", "2-3", "4-7", "8+")


def test_a_real_server_shows_evidence_at_one_and_at_four_concurrent_requests(
        tmp_path, model, llama_server_bin, start_daemon):
    target = llama_target(model, llama_server_bin, tuning={"enabled": False},
                          args=["--ctx-size", "4096", "--parallel", "4", "--threads", "1"],
                          speculation={"method": "ngram", "variant": "mod",
                                       "length": {"start": 8}})
    fleet = write_fleet(tmp_path, {"t": target})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "ready")
    doc = __import__("yaml").safe_load(fleet.read_text())
    proxy, api = doc["daemon"]["proxy"]["listen"], doc["daemon"]["api"]
    prompt = ("def f(x):\n    return x + 1\n\n" * 6) + "# the same again:\n"

    def ask() -> None:
        body = json.dumps({"model": "t", "prompt": prompt, "max_tokens": 48,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{proxy}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=300).read()

    for _ in range(2):
        ask()
    wait_for(lambda: "1" in daemon.target("t").get("by_load", {}), 30, "the 1-request bucket")
    for _ in range(2):
        clients = [threading.Thread(target=ask) for _ in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()

    def crowded() -> dict | None:
        by_load = daemon.target("t").get("by_load", {})
        return by_load if set(by_load) - {"1"} else None

    by_load = wait_for(crowded, 30, "a bucket above one request")
    assert by_load["1"]["tokens"] > 0 and by_load["1"]["throughput"] > 0
    busy = [label for label in by_load if label != "1"]
    assert all(by_load[b]["tokens"] > 0 for b in busy)
    view = json.loads(urllib.request.urlopen(f"http://{api}/v1/targets/t", timeout=30).read())
    assert set(view["by_load"]) == set(by_load)
    metrics = urllib.request.urlopen(f"http://{api}/metrics", timeout=30).read().decode()
    assert f'load="{busy[0]}"' in metrics
    out = subprocess.run([sys.executable, "-m", "supervisor", "status", str(fleet),
                          "--target", "t"], capture_output=True, text=True, cwd=REPO,
                         timeout=60, check=True).stdout
    assert "by load" in out and busy[0] in out
