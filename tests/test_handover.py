"""A planned restart beside the running server (supervision/handover.py), in-process: the
fake backend and launcher of test_target_lifecycle.py, the owner task for real.

What must hold: the target never stops serving (no state change at all), the proxy's
requests already on the old server finish there before it stops, new ones go to the new
server, and anything that goes wrong before the switch leaves the old server serving and
falls back to the restart in place, saying why.
"""

# ruff: noqa: F811 (start_target is the lifecycle tests' fixture, taken as a parameter)
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from supervisor.plugin import Readiness
from supervisor.supervision.commands import Command
from supervisor.supervision.handover import host_room, in_place_reason, next_port, on_gpu
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.states import State
from tests.test_target_lifecycle import START, Run, start_target  # noqa: F401

S = State


def replace_events(run: Run) -> list[str]:
    return [e.data["replace"] for e in run.events if e.kind == "replace"]


def port_of(spec) -> int:
    return int(spec.argv[spec.argv.index("--port") + 1])


async def relay_once(run: Run) -> str:
    async with run.sup.served.relaying() as url:
        return url


async def test_a_retune_starts_the_new_server_beside_the_old_and_never_stops_serving(
        start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    old = run.process
    run.world.start_readiness = Readiness.LOADING  # the new server takes a while to load
    async with run.sup.served.relaying() as old_url:  # a request on the old server
        run.sup.send(Command.RETUNE, "draft length 8 -> 4")
        await run.until(lambda: len(run.world.processes) == 2)
        assert run.sup.serving and run.sup.served.base_url == old_url  # still the old one
        run.world.readiness = Readiness.READY
        await run.until(lambda: "switched" in replace_events(run))
        new_url = run.sup.served.base_url
        assert new_url != old_url and str(port_of(run.world.starts[1])) in new_url
        # On the CPU (no VRAM plan here) a new request waits for the old server's last one.
        later = asyncio.create_task(relay_once(run))
        await asyncio.sleep(0.1)
        assert not later.done(), "a new request ran beside the old server's last one"
        assert old.returncode is None, "the old server stopped under a request"
        # Both compute on the same cores: the new server's numbers are no evidence yet.
        assert run.sup.tuner.sharing_cores
    assert await asyncio.wait_for(later, 5) == new_url  # new requests go to the new server
    await run.until(lambda: old.returncode is not None)
    await run.until(lambda: not run.sup.tuner.sharing_cores)
    assert old.signals == ["SIGTERM"]
    assert run.process.returncode is None and run.sup.process is run.process
    assert run.transitions == START  # never stopping, never starting: no gap
    assert replace_events(run) == ["beside", "switched", "retired"]
    switched = next(e for e in run.events if e.data.get("replace") == "switched")
    assert switched.data["held"] and "new requests wait for them" in switched.reason
    assert run.sup.status().restarts_by_reason == {"retune": 1}


async def test_the_new_server_is_supervised_after_the_switch(start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    run.sup.send(Command.RESTART, "restart through the API")
    await run.until(lambda: "retired" in replace_events(run))
    run.process.exit(-9)  # the new server crashes: the usual crash handling
    await run.reaches(S.READY, times=2)
    assert run.transitions == [*START, (S.READY, S.BACKOFF), (S.BACKOFF, S.STARTING),
                               (S.STARTING, S.LOADING), (S.LOADING, S.READY)]
    # The restart in place keeps the port it ran on.
    assert port_of(run.world.starts[2]) == port_of(run.world.starts[1])


async def test_a_new_server_that_exits_while_loading_falls_back_to_a_restart_in_place(
        start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    old = run.process
    run.world.exit_at_start = 1
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.until(lambda: "in_place" in replace_events(run))
    fallback = next(e for e in run.events if e.data.get("replace") == "in_place")
    assert "exited with status 1 while it loaded" in fallback.reason
    await run.reaches(S.STOPPING)
    await run.until(lambda: old.returncode is not None)  # stopped, then started in place
    assert replace_events(run) == ["beside", "in_place"]


async def test_auto_restarts_in_place_when_the_proxy_is_off(start_target):
    run = start_target(beside=True, proxied=False)
    await run.reaches(S.READY)
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.READY, times=2)
    assert len(run.world.processes) == 2 and port_of(run.world.starts[1]) == 1
    assert replace_events(run) == ["in_place"]
    assert "the proxy is off" in next(e.reason for e in run.events if e.kind == "replace")
    assert run.transitions == [*START, (S.READY, S.STOPPING), (S.STOPPING, S.STARTING),
                               (S.STARTING, S.LOADING), (S.LOADING, S.READY)]


async def test_beside_restarts_in_place_without_a_memory_estimate(start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    run.world.memory = None
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.READY, times=2)
    assert replace_events(run) == ["in_place"]
    assert "no memory estimate" in next(e.reason for e in run.events if e.kind == "replace")


async def test_a_shutdown_while_the_new_server_loads_stops_both(start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    old = run.process
    run.world.start_readiness = Readiness.LOADING
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.until(lambda: len(run.world.processes) == 2)
    new = run.process
    await run.sup.shutdown("daemon stopping")
    assert old.returncode is not None and new.returncode is not None
    assert new.signals == ["SIGKILL"]
    assert replace_events(run) == ["beside", "abandoned"]
    assert run.transitions[-2:] == [(S.READY, S.STOPPING), (S.STOPPING, S.STOPPED)]


async def test_an_owner_that_ends_kills_the_old_server_still_draining(start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    old = run.process
    async with run.sup.served.relaying():
        run.sup.send(Command.RETUNE, "draft length 8 -> 4")
        await run.until(lambda: "switched" in replace_events(run))
        await run.sup.shutdown("daemon stopping")
        assert old.returncode is not None and run.process.returncode is not None
    assert not run.sup.retiring


def test_why_a_restart_happens_in_place():
    assert in_place_reason("beside", True, "process", proxied=False) is None
    assert in_place_reason("auto", True, "process", proxied=True) is None
    assert "proxy is off" in in_place_reason("auto", True, "process", proxied=False)
    assert "in_place" in in_place_reason("in_place", True, "process", proxied=True)
    assert "'systemd' launcher" in in_place_reason("beside", False, "systemd", proxied=True)


def test_host_room_needs_the_estimate_and_a_margin():
    gib = 1024**3
    assert host_room(2 * gib, 3 * gib)[0]
    assert not host_room(2 * gib, 2 * gib)[0]  # nothing left for the rest of the box
    assert not host_room(None, 100 * gib)[0]
    assert "2.00 GiB" in host_room(2 * gib, 3 * gib)[1]


def test_the_port_goes_home_when_it_is_free():
    spare = iter([40001, 40002]).__next__
    assert next_port(8080, 8080, lambda p: True, spare) == 40001  # on its own port: elsewhere
    assert next_port(40001, 8080, lambda p: True, spare) == 8080  # elsewhere: home again
    assert next_port(40001, 8080, lambda p: False, spare) == 40002  # home taken: elsewhere


def test_why_a_reload_restarts_a_changed_target_in_place():
    from supervisor.config.schema import Target
    from supervisor.daemon.replacing import reload_in_place_reason

    old = Target(name="t", backend="fake", model="m", port=1)
    new = Target(name="t", backend="fake", model="m2", port=1)
    assert reload_in_place_reason(old, S.READY, new, True, proxied=True) is None
    assert reload_in_place_reason(old, S.DEGRADED, new, True, proxied=True) is None
    assert "no service to keep" in reload_in_place_reason(old, S.BACKOFF, new, True, True)
    assert "no service to keep" in reload_in_place_reason(old, S.UNLOADED, new, True, True)
    moved = Target(name="t", backend="fake", model="m", port=1, launcher="systemd")
    assert "launcher changes (process -> systemd)" in reload_in_place_reason(
        old, S.READY, moved, True, True)
    assert "proxy is off" in reload_in_place_reason(old, S.READY, new, True, proxied=False)
    assert "'process' launcher" in reload_in_place_reason(old, S.READY, new, False, True)


def test_a_new_supervisor_not_started_yet_is_not_taken_for_one_that_failed():
    from supervisor.daemon.replacing import until_serving

    class Sup:  # before its task first runs: stopped, then it starts and becomes ready
        def __init__(self) -> None:
            from supervisor.supervision.states import StateChanges
            self.state, self.changes, self.last_event = S.STOPPED, StateChanges(), None

    async def scenario() -> tuple[str | None, str | None]:
        sup = Sup()
        waiting = asyncio.create_task(until_serving(sup, 5.0))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        for state in (S.STARTING, S.LOADING, S.READY):
            sup.state = state
            sup.changes.wake()
        ready = await waiting
        failing = Sup()
        waiting = asyncio.create_task(until_serving(failing, 5.0))
        await asyncio.sleep(0.01)
        failing.state = S.BACKOFF
        failing.changes.wake()
        return ready, await waiting

    ready, failed = asyncio.run(scenario())
    assert ready is None and failed == "went backoff"


async def test_held_requests_go_once_the_old_route_drains_or_the_hold_ends():
    book = ProxyRequests()
    async with book.relaying():  # on the old server
        old = book.switch_route()
        book.hold_new(old, timeout=30)
        waiting = asyncio.create_task(book.admitted())
        await asyncio.sleep(0.05)
        assert not waiting.done()
    await asyncio.wait_for(waiting, 1)  # the last old request ended: held requests go
    async with book.relaying():
        book.hold_new(book.switch_route(), timeout=0.05)
        await asyncio.wait_for(book.admitted(), 1)  # the hold ends at its deadline
    book.hold_new(book.switch_route(), timeout=30)  # nothing in flight there: no hold
    await asyncio.wait_for(book.admitted(), 0.1)


def test_only_a_target_the_vram_plan_puts_on_a_gpu_counts_as_on_one():
    def owner(placer):
        return SimpleNamespace(name="t", placer=placer)

    def placer(on: dict[str, bool] | None):
        return SimpleNamespace(fleet_plan=None if on is None else SimpleNamespace(on_gpu=on))

    assert not on_gpu(owner(None)) and not on_gpu(owner(placer(None)))
    assert not on_gpu(owner(placer({"t": False}))) and not on_gpu(owner(placer({})))
    assert on_gpu(owner(placer({"t": True})))


async def test_a_reload_beside_on_the_cpu_holds_new_requests_and_the_tuner_until_the_old_is_done(
        start_target):
    """daemon/replacing.py: the changed target's new supervisor serves beside the old one;
    while the old server finishes its request on the same cores, the new one's requests wait
    and its tuner takes nothing as evidence (as in a retune's handover)."""
    from supervisor.daemon.replacing import replace_beside
    from supervisor.events import EventBus

    old, new = start_target(beside=True), start_target(beside=True)
    await old.reaches(S.READY)
    await new.reaches(S.READY)
    bus, seen = EventBus(), []
    bus.subscribe(lambda e: (seen.append(e), new.notify()))
    steps = lambda: [e.data["replace"] for e in seen]  # noqa: E731
    async with old.sup.served.relaying():  # a request on the old server
        replacing = asyncio.create_task(replace_beside(
            old.sup, new.sup, bus, start=lambda sup: None, switch=lambda sup: None))
        await new.until(lambda: "switched" in steps())
        assert new.sup.tuner.sharing_cores
        later = asyncio.create_task(relay_once(new))
        await asyncio.sleep(0.1)
        assert not later.done(), "a new request ran beside the old server's last one"
    await asyncio.wait_for(later, 5)
    assert await asyncio.wait_for(replacing, 5)
    assert steps() == ["beside", "switched", "retired"]
    assert not new.sup.tuner.sharing_cores
    switched = next(e for e in seen if e.data["replace"] == "switched")
    assert switched.data["held"] and switched.data["in_flight"] == 1
    assert "new requests wait for them" in switched.reason

    # Nothing in flight on the old server: nothing to wait for, the tuner's evidence counts.
    again = start_target(beside=True)
    await again.reaches(S.READY)
    seen.clear()
    assert await asyncio.wait_for(replace_beside(new.sup, again.sup, bus, start=lambda s: None,
                                                 switch=lambda s: None), 5)
    switched = next(e for e in seen if e.data["replace"] == "switched")
    assert not switched.data["held"] and not again.sup.tuner.sharing_cores
    await asyncio.wait_for(relay_once(again), 1)
