"""The status page's login slows a guesser down (supervisor/api/throttle.py): pure, the
clock passed in."""

from __future__ import annotations

from supervisor.api.throttle import FREE, MAX_LOCK, LoginThrottle


def test_the_first_wrong_tokens_are_free_then_each_locks_twice_as_long():
    throttle = LoginThrottle()
    for _ in range(FREE - 1):
        throttle.failed("10.0.0.1", 100.0)
        assert throttle.wait("10.0.0.1", 100.0) == 0
    locks = []
    for n in range(4):
        throttle.failed("10.0.0.1", 100.0 + n * 1000)
        locks.append(throttle.wait("10.0.0.1", 100.0 + n * 1000))
    assert locks == [2.0, 4.0, 8.0, 16.0]
    assert throttle.wait("10.0.0.1", 100.0 + 3000 + 15) == 1.0
    assert throttle.wait("10.0.0.1", 100.0 + 3000 + 16) == 0
    assert throttle.wait("10.0.0.2", 3100.0) == 0  # per address


def test_the_lock_is_bounded_and_the_right_token_ends_the_run():
    throttle = LoginThrottle()
    for _ in range(FREE + 30):
        throttle.failed("c", 0.0)
    assert throttle.wait("c", 0.0) == MAX_LOCK
    throttle.succeeded("c")
    assert throttle.wait("c", 0.0) == 0
    for _ in range(FREE - 1):
        throttle.failed("c", 0.0)
    assert throttle.wait("c", 0.0) == 0  # counting starts again


def test_a_run_of_failures_says_once_that_it_starts_to_lock():
    throttle = LoginThrottle()
    said = [throttle.failed("c", float(n)) for n in range(FREE + 5)]
    assert said.count(True) == 1 and said[FREE - 1] is True
    throttle.succeeded("c")
    assert [throttle.failed("c", 0.0) for _ in range(FREE)][-1] is True  # a new run
