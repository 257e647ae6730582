"""A metrics read is skipped only when nothing can have changed (supervision/probes.py
QuietRuntime): checked against real processes, one asleep and one spinning."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from supervisor.config.schema import Target
from supervisor.plugin.backend import MetricsSample
from supervisor.supervision.probes import QuietRuntime
from supervisor.supervision.requests import ProxyRequests
from supervisor.tuning.autotuner import AutoTuner
from supervisor.tuning.window import Delta


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_an_idle_runtime_is_not_asked_again_until_the_gap_or_a_proxy_request(sleeper):
    quiet_at: list[float] = []
    mark = ["a"]
    now = [0.0]
    quiet = QuietRuntime(sleeper, lambda: mark[0], quiet_at.append, clock=lambda: now[0],
                         max_gap=30)
    assert not quiet.unchanged()  # never read yet
    quiet.read()
    assert quiet.unchanged() and quiet.unchanged() and len(quiet_at) == 2
    mark[0] = "b"  # a request went through the proxy
    assert not quiet.unchanged()
    quiet.read()
    now[0] = 30.0  # the read is as old as max_gap
    assert not quiet.unchanged() and len(quiet_at) == 2


def test_a_runtime_that_uses_cpu_is_read():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        quiet = QuietRuntime(spinner.pid, lambda: None, lambda now: None)
        quiet.read()
        time.sleep(0.3)  # 30 clock ticks of a spinning process
        assert not quiet.unchanged()
    finally:
        spinner.kill()
        spinner.wait()


def test_without_a_local_pid_every_read_is_made():
    quiet = QuietRuntime(0, lambda: None, lambda now: None)  # a process on another machine
    quiet.read()
    assert not quiet.unchanged()


async def test_a_request_in_flight_always_changes_the_proxy_mark():
    requests = ProxyRequests()
    idle = requests.mark()
    assert requests.mark() == idle
    async with requests.relaying():
        assert requests.mark() != requests.mark()
    assert requests.mark() != idle  # last_used moved


def test_a_quiet_interval_is_filed_at_the_load_the_last_read_saw_then_as_idle():
    target = Target(name="t", backend="llamacpp", model="/m.gguf", port=1,
                    speculation={"method": "ngram", "variant": "mod"})
    tuner = AutoTuner(target, LlamaCppBackend(target), None, lambda *a, **k: None)
    tuner.observe(MetricsSample(drafts=5, draft_tokens=20, accepted_tokens=10,
                                tokens_predicted=40, tokens_predicted_seconds=1.0,
                                requests_processing=2))
    start = tuner.by_load.last_read[0]
    tuner.by_load.quiet(start + 5)  # the two requests ended some time in these 5 s
    tuner.by_load.quiet(start + 65)  # a minute of nothing: no busy time at any load
    # Busy time is booked with the tokens it produced (tuning/load.py): the next ones.
    tuner.by_load.add(Delta(time=start + 66, drafts=1, draft_tokens=4, accepted=2,
                            per_position=(1, 1), tokens=30, seconds=0.5), 2)
    busy = {label: s.busy_seconds for label, s in tuner.by_load.stats().items()}
    assert busy == {"2-3": 5.0}
