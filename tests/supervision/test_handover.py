"""A planned restart beside the running server (supervision/handover.py), in-process: the
fake backend and launcher of test_target_lifecycle.py, the owner task for real.

What must hold: the target never stops serving (no state change at all), the proxy's
requests already on the old server finish there before it stops, new ones go to the new
server, and anything that goes wrong before the switch leaves the old server serving and
falls back to the restart in place, saying why.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from supervisor.plugin import Readiness
from supervisor.supervision.commands import Command
from supervisor.supervision.handover import (
    host_room,
    in_place_reason,
    next_port,
    on_gpu,
    reload_in_place_reason,
)
from supervisor.supervision.requests import ProxyRequests
from supervisor.supervision.states import State
from tests.lifecycle_doubles import RESTART_TO_READY, START, Run

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
    assert not run.sup.handover.retiring


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


def reload(run: Run, unloaded: bool = False, **change: object) -> None:
    """What the fleet does for a target a reload changed: the owner's new definition."""
    sup = run.sup
    target = sup.target.model_copy(update=change)
    sup.redefine(sup.define(target, sup.home.with_target(target), sup.launcher),
                 "changed in fleet.yaml (reload)", unloaded=unloaded)


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
    def placer(on: dict[str, bool] | None):
        return SimpleNamespace(fleet_plan=None if on is None else SimpleNamespace(on_gpu=on))

    assert not on_gpu(None, "t") and not on_gpu(placer(None), "t")
    assert not on_gpu(placer({"t": False}), "t") and not on_gpu(placer({}), "t")
    assert on_gpu(placer({"t": True}), "t")


async def test_a_reload_beside_on_the_cpu_holds_new_requests_and_the_tuner_until_the_old_is_done(
        start_target):
    """A reload that changes a serving target goes the retune's way, in the same owner: its
    new definition's server starts beside the old one; while the old server finishes its
    request on the same cores, new requests wait and the new tuner takes nothing as
    evidence."""
    run = start_target(beside=True)
    await run.reaches(S.READY)
    owner, old, old_tuner = run.sup, run.process, run.sup.tuner
    async with run.sup.served.relaying():  # a request on the old server
        reload(run, model="m2")
        await run.until(lambda: "switched" in replace_events(run))
        assert run.sup.tuner is not old_tuner and run.sup.tuner.sharing_cores
        assert run.sup.target.model == "m2" and run.sup.tuner.target.model == "m2"
        later = asyncio.create_task(relay_once(run))
        await asyncio.sleep(0.1)
        assert not later.done(), "a new request ran beside the old server's last one"
    await asyncio.wait_for(later, 5)
    await run.until(lambda: "retired" in replace_events(run))
    assert replace_events(run) == ["beside", "switched", "retired"]
    assert not run.sup.tuner.sharing_cores and old.returncode is not None
    assert run.sup is owner and run.transitions == START  # one owner, never a gap
    switched = next(e for e in run.events if e.data.get("replace") == "switched")
    assert switched.data["held"] and switched.data["in_flight"] == 1
    assert "new requests wait for them" in switched.reason
    assert run.sup.status().restarts_by_reason == {}  # a new definition counts afresh


async def test_a_reload_with_nothing_in_flight_switches_at_once_and_counts_evidence(
        start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    reload(run, model="m2")
    await run.until(lambda: "retired" in replace_events(run))
    switched = next(e for e in run.events if e.data.get("replace") == "switched")
    assert not switched.data["held"] and not run.sup.tuner.sharing_cores
    await asyncio.wait_for(relay_once(run), 1)


async def test_a_reload_of_a_target_that_does_not_serve_starts_the_new_definition_in_place(
        start_target):
    run = start_target(restart={"max_crashes": 1})
    await run.reaches(S.READY)
    run.process.exit(1)
    await run.reaches(S.FAILED)
    reload(run, model="m2", port=7)
    await run.reaches(S.READY, times=2)
    assert run.transitions[-3:] == [(S.FAILED, S.STARTING), *RESTART_TO_READY]
    assert port_of(run.world.starts[-1]) == 7 and run.sup.target.model == "m2"
    assert run.sup.status().restarts == 0  # its restarts counted afresh

    # One that loads on demand goes back to unloaded, and loads at the next request.
    on_demand = start_target(restart={"max_crashes": 1})
    await on_demand.reaches(S.READY)
    on_demand.process.exit(1)
    await on_demand.reaches(S.FAILED)
    reload(on_demand, unloaded=True, model="m2", start="on_demand")
    await on_demand.reaches(S.UNLOADED)
    assert on_demand.transitions[-1] == (S.FAILED, S.UNLOADED)
    assert on_demand.sup.served.unavailable_reason() is None  # a request loads it
    assert await on_demand.sup.served.wait_serving(5)


async def test_a_reload_that_cannot_go_beside_stops_the_old_server_first(start_target):
    run = start_target(beside=True, proxied=False)
    await run.reaches(S.READY)
    old = run.process
    async with run.sup.served.relaying():  # in flight: finished before the old one stops
        reload(run, model="m2")
        await run.reaches(S.STOPPING)
        await asyncio.sleep(0.05)
        assert old.returncode is None, "the old server stopped under its request"
    await run.reaches(S.READY, times=2)
    assert old.returncode is not None and run.sup.target.model == "m2"
    assert replace_events(run) == ["in_place"]
    said = next(e for e in run.events if e.kind == "replace")
    assert said.reason.startswith("restarting in place after the reload: the proxy is off")
    assert run.transitions == [*START, (S.READY, S.STOPPING), (S.STOPPING, S.STARTING),
                               *RESTART_TO_READY]


async def test_a_second_reload_while_the_first_ones_server_loads_wins(start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    old = run.process
    run.world.start_readiness = Readiness.LOADING  # the first reload's server loads slowly
    reload(run, model="m2")
    await run.until(lambda: len(run.world.processes) == 2)
    first_new = run.process
    run.world.start_readiness = Readiness.READY
    reload(run, model="m3")
    await run.until(lambda: "retired" in replace_events(run))
    assert first_new.returncode is not None and first_new.signals == ["SIGKILL"]
    assert replace_events(run) == ["beside", "abandoned", "beside", "switched", "retired"]
    assert run.sup.target.model == "m3" and old.returncode is not None
    assert run.transitions == START


async def test_after_a_restart_beside_status_shows_only_the_new_process_and_the_restart(
        start_target):
    """Seen in the page and the CLI: right after an API restart beside the old server, the
    new process (up 0 s, no token yet) showed the old one's speed and memory, and the last
    event was a health check from minutes before."""
    import dataclasses
    import time

    from supervisor.plugin import MetricsSample
    from supervisor.supervision import labels
    from supervisor.tuning.window import Delta

    run = start_target(beside=True)
    await run.reaches(S.READY)
    old_pid = run.process.pid
    # What the old process did: its speed in the window, its counters, its memory.
    run.sup.tuner.window.add(Delta(time.time(), 10, 40, 30, (10, 8, 7, 5), 400, 10.0),
                             time.time())
    run.sup.metrics = MetricsSample(tokens_predicted=400, tokens_predicted_seconds=10.0)
    run.sup.seen_using({"rss_bytes": 401 << 20})
    before = run.sup.status()
    assert before.shown["tokens_per_second"] and before.resources
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.until(lambda: "switched" in replace_events(run))
    now = run.sup.status()
    assert now.pid == run.process.pid != old_pid
    assert now.shown["tokens_per_second"] is None and now.shown["acceptance_rate"] is None
    assert now.resources == {} and run.sup.metrics is None
    last = now.last_event  # the restart's: switched, or the old one retired already
    assert last["kind"] == "replace" and last["data"]["replace"] in ("switched", "retired")
    shown = labels.display(dataclasses.asdict(now))
    assert shown["speed"] == labels.NONE and shown["memory"] == labels.NONE
    assert last["reason"] in shown["last_event"]
    # The tuner keeps what it learnt of the text: its evidence is not the status's speed.
    assert run.sup.tuner.window.stats().tokens == 400


async def test_a_restart_asked_while_a_reloads_server_loads_does_not_drop_the_reload(
        start_target):
    run = start_target(beside=True)
    await run.reaches(S.READY)
    run.world.start_readiness = Readiness.LOADING  # the reload's server loads slowly
    reload(run, model="m2")
    await run.until(lambda: len(run.world.processes) == 2)
    run.world.start_readiness = Readiness.READY
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.until(lambda: "retired" in replace_events(run))
    assert run.sup.target.model == "m2"  # the new definition serves, not the old restarted
    assert replace_events(run) == ["beside", "abandoned", "beside", "switched", "retired"]
