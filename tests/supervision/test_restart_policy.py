"""The restart policy with plain values: backoff, jitter, crash-loop cut-off, permanent failures."""

from __future__ import annotations

import pytest

from supervisor.config.schema import Health, Restart
from supervisor.plugin.backend import Failure, FailureKind
from supervisor.supervision.probes import LivenessTracker
from supervisor.supervision.restart_policy import after_failure

CRASH = Failure(FailureKind.CRASH, "llama-server killed by signal SIGKILL")
NO_JITTER = Restart(jitter=0.0)


def test_first_restart_waits_backoff_initial():
    d = after_failure(CRASH, (100.0,), 100.0, NO_JITTER, rand=0.5)
    assert not d.give_up
    assert d.delay == pytest.approx(2.0)


def test_backoff_doubles_per_recent_crash_and_is_capped():
    times: tuple[float, ...] = ()
    delays = []
    settings = Restart(jitter=0.0, backoff_max=10, max_crashes=100)
    for i in range(6):
        times += (float(i),)
        delays.append(after_failure(CRASH, times, float(i), settings, 0.5).delay)
    assert delays == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_jitter_spreads_the_delay_within_its_fraction():
    low = after_failure(CRASH, (0.0,), 0.0, Restart(jitter=0.2), rand=0.0).delay
    high = after_failure(CRASH, (0.0,), 0.0, Restart(jitter=0.2), rand=0.999999).delay
    assert low == pytest.approx(1.6)
    assert high == pytest.approx(2.4, abs=1e-4)


def test_crash_loop_gives_up_after_five_crashes_in_ten_minutes():
    times = (0.0, 60.0, 120.0, 180.0)
    assert not after_failure(CRASH, times, 180.0, Restart(), 0.5).give_up
    decision = after_failure(CRASH, (*times, 240.0), 240.0, Restart(), 0.5)
    assert decision.give_up
    assert "5 crashes within 10m" in decision.reason


def test_old_crashes_outside_the_window_do_not_count():
    times = (0.0, 10.0, 20.0, 30.0, 700.0)
    decision = after_failure(CRASH, times, 700.0, NO_JITTER, 0.5)
    assert not decision.give_up
    assert decision.delay == pytest.approx(2.0)  # the only recent crash is this one


@pytest.mark.parametrize("kind", [FailureKind.LOAD_ERROR, FailureKind.BAD_ARGUMENTS])
def test_a_permanent_failure_is_not_retried(kind):
    decision = after_failure(Failure(kind, "it failed", retryable=False), (0.0,), 0.0,
                             Restart(), 0.5)
    assert decision.give_up
    assert decision.reason.startswith("it failed; not restarting")


def test_a_hang_is_declared_after_the_configured_consecutive_failures_only():
    tracker = LivenessTracker(Health(failures=3))
    assert not tracker.failed()
    assert not tracker.failed()
    tracker.ok()  # one good answer resets the count
    assert not tracker.failed()
    assert not tracker.failed()
    assert tracker.failed()


OOM = Failure(FailureKind.OUT_OF_MEMORY, "out of memory: cudaMalloc failed: out of memory")


@pytest.mark.parametrize("fits_now", [True, None])
def test_a_first_out_of_memory_gets_one_restart_when_it_fits_or_nobody_can_tell(fits_now):
    decision = after_failure(OOM, (0.0,), 0.0, NO_JITTER, 0.5, oom_times=(0.0,),
                             fits_now=fits_now)
    assert not decision.give_up
    assert "one restart after out of memory" in decision.reason
    assert "a second one within 10m00s ends in failed" in decision.reason


def test_an_out_of_memory_that_still_does_not_fit_is_not_restarted():
    decision = after_failure(OOM, (0.0,), 0.0, NO_JITTER, 0.5, oom_times=(0.0,),
                             fits_now=False, fit_detail="needs 30.00 GiB but GPU 0 has 12.00 GiB")
    assert decision.give_up
    assert "does not fit now either (needs 30.00 GiB but GPU 0 has 12.00 GiB)" in decision.reason


def test_a_second_out_of_memory_within_the_window_ends_in_failed_even_if_it_fits():
    decision = after_failure(OOM, (0.0, 5.0), 5.0, NO_JITTER, 0.5, oom_times=(0.0, 5.0),
                             fits_now=True)
    assert decision.give_up
    assert "out of memory 2 times within 10m00s: not restarting into the same failure" \
        in decision.reason


def test_an_out_of_memory_long_after_the_last_one_gets_its_restart_again():
    decision = after_failure(OOM, (0.0, 900.0), 900.0, NO_JITTER, 0.5, oom_times=(0.0, 900.0))
    assert not decision.give_up


async def test_the_crash_history_keeps_only_the_window_it_is_judged_by():
    """A daemon up for months: crashes older than `restart.window` are dropped, and the
    decision is the same as with every crash kept."""
    from supervisor.config.schema import Target
    from supervisor.supervision.crashes import CrashHistory

    target = Target(name="t", model="/m.gguf", port=1,
                    restart={"window": "10m", "max_crashes": 5})
    now = [0.0]
    history = CrashHistory(target, None, lambda: now[0], lambda: 0.5)
    for _ in range(1000):  # one crash an hour: never a loop
        now[0] += 3600
        decision = await history.decide(CRASH)
        assert not decision.give_up
    assert history._crash_times == [now[0]]
    now[0] += 3600
    for _ in range(4):  # then a crash loop: the fifth within the window gives up
        now[0] += 10
        assert not (await history.decide(CRASH)).give_up
    assert (await history.decide(CRASH)).give_up
