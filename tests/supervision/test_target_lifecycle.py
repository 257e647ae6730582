"""The target state machine in-process: a fake backend registered like a real plugin, a fake
launcher, an injected clock. Each scenario asserts the exact list of transitions; together
the scenarios cover every edge of the allowed-transition table (last test).

The owner task runs for real; tests wait for events, never for wall-clock time, and every
setting is tiny (backoff 10 ms, probes every 10 ms) so the whole file takes about a second.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from supervisor.errors import NotReachableYet, SpecfleetError
from supervisor.plugin import MetricsSample, Readiness
from supervisor.supervision.commands import Command
from supervisor.supervision.states import ALLOWED, State
from tests.lifecycle_doubles import (
    RESTART_TO_READY,
    START,
    FakeBackend,
    FakeClock,
    FakeLauncher,
    FakeProcess,
)

# --- start ---

async def test_a_target_starts_loads_and_becomes_ready(start_target):
    run = start_target()
    await run.reaches(S.READY)
    assert run.transitions == START
    assert run.sup.serving and run.sup.crashes.restarts == 0
    assert run.world.starts[0].argv == ("fake-runtime", "--port", "1")

S = State


async def test_a_truncated_model_file_waits_without_a_start_until_a_whole_one_is_there(
        start_target, tmp_path):
    from tests.ggufs import write_model
    path = write_model(tmp_path / "m.gguf")
    whole = path.read_bytes()
    path.write_bytes(whole[:-64])  # a copy that did not finish
    run = start_target(model=str(path))
    await run.reaches(S.WAITING)
    await asyncio.sleep(0.1)  # it looks again (every 0.01 s doubling, at most 10 s) ...
    assert run.world.starts == [] and run.sup.state is S.WAITING  # ... and starts nothing
    waiting = run.events[-1]
    assert "model file" in waiting.reason and "is truncated" in waiting.reason
    assert "the rest of the fleet is not affected" in waiting.reason
    assert waiting.data["failure"] == "missing"
    assert run.sup.served.unavailable_reason().startswith("waiting: model file")
    path.write_bytes(whole)  # the copy finished
    await run.reaches(S.READY)
    assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, S.WAITING),
                               (S.WAITING, S.STARTING), (S.STARTING, S.LOADING),
                               (S.LOADING, S.READY)]
    assert len(run.world.starts) == 1 and run.sup.served.unavailable_reason() is None
    assert "no longer waiting for: model file" in next(
        e.reason for e in run.events if e.old == "waiting")


async def test_a_missing_model_waits_for_its_file_and_a_stop_ends_the_wait(start_target,
                                                                           tmp_path):
    run = start_target(model=str(tmp_path / "nas" / "m.gguf"))
    await run.reaches(S.WAITING)
    assert "does not exist" in run.events[-1].reason
    run.sup.send(Command.UNLOAD, "unloaded by a test")
    await run.reaches(S.UNLOADED)
    run.sup.send(Command.START, "asked for")
    await run.reaches(S.WAITING, times=2)
    await run.sup.shutdown("stopped by a test")
    assert run.transitions[-1] == (S.WAITING, S.STOPPED)
    assert run.world.starts == []


async def test_a_restart_that_could_not_start_again_leaves_the_serving_server_alone(
        start_target, tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    run = start_target(model=str(model))
    await run.reaches(S.READY)
    serving = run.process
    model.rename(tmp_path / "away.gguf")  # the NAS went away; the model is loaded already
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.until(lambda: any(e.kind == "restart" for e in run.events))
    said = next(e for e in run.events if e.kind == "restart")
    assert said.reason.startswith("restart requested through the API: not done, the running "
                                  f"server (pid {serving.pid}) keeps serving: model file")
    assert said.data == {"refused": True}
    await asyncio.sleep(0.1)
    assert run.sup.state is S.READY and run.process is serving and len(run.world.starts) == 1
    assert run.sup.crashes.by_reason == {}  # not counted as a restart
    (tmp_path / "away.gguf").rename(model)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.until(lambda: len(run.world.starts) == 2 and run.sup.state is S.READY)
    assert run.process is not serving


async def test_an_error_while_looking_again_fails_the_target_with_its_text(
        start_target, tmp_path, monkeypatch):
    run = start_target(model=str(tmp_path / "m.gguf"))
    await run.reaches(S.WAITING)

    def broken(cls: type, target: Any) -> list[Any]:
        raise PermissionError("the check itself broke")
    monkeypatch.setattr(FakeBackend, "check", classmethod(broken))
    await run.reaches(S.FAILED)
    assert run.transitions[-1] == (S.WAITING, S.FAILED)
    assert "the check itself broke" in run.events[-1].reason


async def test_a_port_another_program_holds_is_waited_for_not_counted_as_a_crash(
        start_target):
    import socket
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = start_target(port=port, host="127.0.0.1", restart={"max_crashes": 2})
        run.world.port_in_use = True
        run.world.exit_at_start = 1
        await run.reaches(S.WAITING)
        await asyncio.sleep(0.2)  # many looks again (0.01 s doubling): no start, no crash loop
        assert len(run.world.starts) == 1 and run.sup.state is S.WAITING
        waiting = next(e for e in run.events if e.new == "waiting")
        assert f"couldn't bind to port {port}" in waiting.reason
        assert waiting.data["failure"] == "port_in_use"
        assert f"port {port} on 127.0.0.1 is held by another program" in run.events[-1].reason
        run.world.port_in_use, run.world.exit_at_start = False, None
    # The other program ended.
    await run.reaches(S.READY)
    assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, S.LOADING),
                               (S.LOADING, S.WAITING), (S.WAITING, S.STARTING),
                               (S.STARTING, S.LOADING), (S.LOADING, S.READY)]


async def test_a_start_the_backend_refuses_fails_without_a_process(start_target, monkeypatch):
    async def refuse(self: FakeBackend) -> Any:
        raise SpecfleetError("fake-runtime is too old")
    monkeypatch.setattr(FakeBackend, "preflight", refuse)
    run = start_target()
    await run.reaches(S.FAILED)
    assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, S.FAILED)]
    assert run.world.starts == []
    assert "fake-runtime is too old" in run.events[-1].reason


async def test_a_target_still_running_from_a_previous_daemon_is_adopted_not_started(
        start_target):
    run = start_target(detaches=True, adopt=True)
    await run.reaches(S.READY)
    assert run.transitions == START
    assert run.world.starts == []
    loading = next(e for e in run.events if e.new == "loading")
    assert loading.data == {"pid": run.process.pid, "adopted": True}


async def test_an_api_restart_of_a_running_target_restarts_it(start_target):
    run = start_target()
    await run.reaches(S.READY)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.reaches(S.READY, times=2)
    assert run.transitions == [*START, (S.READY, S.STOPPING), (S.STOPPING, S.STARTING),
                               *RESTART_TO_READY]
    assert run.world.processes[0].signals == ["SIGTERM"]


# --- crash, backoff, give-up ---

CRASH_AND_RESTART = [*START, (S.READY, S.BACKOFF), (S.BACKOFF, S.STARTING), *RESTART_TO_READY]


async def test_a_crash_backs_off_and_restarts(start_target):
    run = start_target()
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.READY, times=2)
    assert run.transitions == CRASH_AND_RESTART
    assert run.sup.crashes.restarts == 1
    backoff = next(e for e in run.events if e.new == "backoff")
    assert "fake-runtime killed by signal SIGKILL" in backoff.reason
    assert backoff.data["delay"] == pytest.approx(0.01)


UNREACHABLE_THEN_UP = [(S.STOPPED, S.STARTING), (S.STARTING, S.WAITING),
                       (S.WAITING, S.STARTING), (S.STARTING, S.LOADING), (S.LOADING, S.READY)]


async def test_a_start_whose_cluster_does_not_answer_yet_waits_and_tries_again(
        start_target, monkeypatch):
    # A Ray head that is down (launcher/ray/raylauncher.py): not final, unlike a start
    # that cannot work; waited for (the start is tried again, with backoff, without end).
    real_start, tries = FakeLauncher.start, []

    async def first_unreachable(self: FakeLauncher, name: str, spec: Any, **kw: Any) -> Any:
        tries.append(name)
        if len(tries) == 1:
            raise NotReachableYet("the Ray cluster at daemon.ray.address x does not answer")
        return await real_start(self, name, spec, **kw)
    monkeypatch.setattr(FakeLauncher, "start", first_unreachable)
    run = start_target()
    await run.reaches(S.READY)
    assert run.transitions == UNREACHABLE_THEN_UP
    waiting = next(e for e in run.events if e.new == "waiting")
    assert waiting.data["failure"] == "unreachable" and "does not answer" in waiting.reason
    assert "tries to start again" in waiting.reason


LOADING_CRASH_LOOP = [(S.STOPPED, S.STARTING)] + [
    (S.STARTING, S.LOADING), (S.LOADING, S.BACKOFF), (S.BACKOFF, S.STARTING)] * 2 + [
    (S.STARTING, S.LOADING), (S.LOADING, S.FAILED)]


async def test_a_crash_loop_gives_up_after_max_crashes(start_target):
    run = start_target(restart={"max_crashes": 3})
    run.world.exit_at_start = 1
    run.world.output = "GGML_ASSERT failed"
    await run.reaches(S.FAILED)
    assert run.transitions == LOADING_CRASH_LOOP
    failed = run.events[-1]
    assert "3 crashes within 10m" in failed.reason
    assert failed.detail == "GGML_ASSERT failed"  # the runtime's own output travels along
    assert run.sup.crashes.restarts == 2


async def test_crashes_further_apart_than_the_window_never_give_up(start_target):
    clock = FakeClock()
    run = start_target(clock=clock, restart={"max_crashes": 2, "window": 600})
    await run.reaches(S.READY)
    for n in range(2, 5):
        clock.advance(601)  # the injected clock: each crash is alone in its window
        run.process.exit(-9)
        await run.reaches(S.READY, times=n)
    assert S.FAILED not in [new for _, new in run.transitions]
    assert run.sup.crashes.restarts == 3


READY_TO_FAILED = [*START, (S.READY, S.FAILED)]


async def test_a_crash_that_reaches_the_limit_goes_from_ready_to_failed(start_target):
    run = start_target(restart={"max_crashes": 1})
    await run.reaches(S.READY)
    run.process.exit(1)
    await run.reaches(S.FAILED)
    assert run.transitions == READY_TO_FAILED


async def test_a_model_that_cannot_load_is_not_retried(start_target):
    run = start_target()
    run.world.readiness = Readiness.LOADING
    await run.reaches(S.LOADING)
    run.world.load_error = True
    run.process.exit(1)
    await run.reaches(S.FAILED)
    assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, S.LOADING),
                               (S.LOADING, S.FAILED)]
    assert "not restarting" in run.events[-1].reason


async def test_a_failed_target_starts_again_when_asked(start_target):
    run = start_target(restart={"max_crashes": 1})
    await run.reaches(S.READY)
    run.process.exit(1)
    await run.reaches(S.FAILED)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.reaches(S.READY, times=2)
    assert run.transitions == [*READY_TO_FAILED, (S.FAILED, S.STARTING), *RESTART_TO_READY]


async def test_stopping_a_target_in_backoff_cancels_the_restart(start_target):
    run = start_target(restart={"backoff_initial": 60, "backoff_max": 60})
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.BACKOFF)
    await run.sup.shutdown("daemon stopping")
    assert run.transitions == [*START, (S.READY, S.BACKOFF), (S.BACKOFF, S.STOPPED)]
    assert len(run.world.starts) == 1


async def test_a_retune_during_backoff_starts_at_once(start_target):
    run = start_target(restart={"backoff_initial": 60, "backoff_max": 60})
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.BACKOFF)
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.READY, times=2)
    assert run.transitions == CRASH_AND_RESTART
    assert run.sup.crashes.restarts == 0  # a command, not the restart policy, started it
    assert run.events[-3].reason == "draft length 8 -> 4"


# --- health: degraded, hang, start timeout ---

DEGRADED_AND_BACK = [*START, (S.READY, S.DEGRADED), (S.DEGRADED, S.READY)]


async def test_a_failed_probe_degrades_and_a_passing_one_recovers(start_target):
    run = start_target(health={"failures": 100})
    await run.reaches(S.READY)
    run.world.readiness = Readiness.UNHEALTHY
    await run.reaches(S.DEGRADED)
    assert run.sup.serving  # degraded still takes requests: a slow probe is no outage
    run.world.readiness = Readiness.READY
    await run.reaches(S.READY, times=2)
    assert run.transitions == DEGRADED_AND_BACK


HANG = [*START, (S.READY, S.DEGRADED), (S.DEGRADED, S.BACKOFF), (S.BACKOFF, S.STARTING), *RESTART_TO_READY]


async def test_a_hung_server_is_killed_and_restarted(start_target):
    run = start_target()
    await run.reaches(S.READY)
    hung = run.process
    run.world.probe_hangs = True
    await run.reaches(S.BACKOFF)
    run.world.probe_hangs = False
    await run.reaches(S.READY, times=2)
    assert run.transitions == HANG
    assert hung.signals == ["SIGKILL"]  # a hung process does not get to ignore SIGTERM
    backoff = next(e for e in run.events if e.new == "backoff")
    assert "3 failed health checks in a row" in backoff.reason


async def test_a_runtime_that_reports_itself_dead_is_restarted_at_once_as_a_crash(start_target):
    # vLLM's API server stays up answering 503 once its engine died: not a hang to wait for.
    run = start_target(health={"failures": 100})
    await run.reaches(S.READY)
    dead = run.process
    run.world.readiness = Readiness.DEAD
    await run.reaches(S.BACKOFF)
    run.world.readiness = Readiness.READY
    await run.reaches(S.READY, times=2)
    assert run.transitions == CRASH_AND_RESTART  # no degraded step, no failures counted
    assert dead.signals and run.sup.crashes.by_reason == {"crash": 1}
    backoff = next(e for e in run.events if e.new == "backoff")
    assert backoff.reason.startswith("fake probe")


async def test_a_hung_server_whose_output_says_why_is_restarted_for_that_reason(start_target):
    run = start_target()
    await run.reaches(S.READY)
    run.world.probe_hangs = True
    run.world.load_error = True  # what the runtime printed before it stopped answering
    await run.reaches(S.FAILED)  # its reason (a load error) is not retried, a hang would be
    failed = next(e for e in run.events if e.new == "failed")
    assert "could not load the model (then it stopped answering" in failed.reason
    assert "failed health checks in a row" in failed.reason


async def test_a_degraded_target_that_crashes_for_good_fails(start_target):
    run = start_target(health={"failures": 100})
    await run.reaches(S.READY)
    run.world.readiness = Readiness.UNHEALTHY
    await run.reaches(S.DEGRADED)
    run.world.load_error = True
    run.process.exit(1)
    await run.reaches(S.FAILED)
    assert run.transitions == [*START, (S.READY, S.DEGRADED), (S.DEGRADED, S.FAILED)]


async def test_a_server_that_never_finishes_loading_times_out(start_target):
    clock = FakeClock()
    run = start_target(clock=clock, health={"start_timeout": 100}, restart={"max_crashes": 1})
    run.world.readiness = Readiness.LOADING
    await run.until(lambda: run.world.probes >= 1)  # the start_timeout clock is running
    clock.advance(101)
    await run.reaches(S.FAILED)
    assert "not ready within start_timeout (100s)" in run.events[-1].reason
    assert run.process.signals == ["SIGKILL"]


# --- planned restart with drain, stop, shutdown, detach ---

PLANNED_RESTART = [*START, (S.READY, S.STOPPING), (S.STOPPING, S.STARTING), *RESTART_TO_READY]


async def test_a_planned_restart_waits_for_requests_in_flight(start_target):
    run = start_target(restart={"stop_grace": 30})
    await run.reaches(S.READY)
    first = run.process
    leave = asyncio.Event()

    async def request() -> list[str]:
        async with run.sup.served.relaying():
            await leave.wait()
            return list(first.signals)  # what the process had been sent meanwhile

    client = asyncio.create_task(request())
    await run.until(lambda: run.sup.requests.in_flight == 1)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.reaches(S.STOPPING)
    assert not run.sup.serving  # new requests wait from here on
    leave.set()
    assert await client == []  # not stopped under the request
    await run.reaches(S.READY, times=2)
    assert first.signals == ["SIGTERM"]
    assert run.transitions == PLANNED_RESTART


async def test_a_drain_that_outlasts_stop_grace_stops_anyway(start_target):
    run = start_target(restart={"stop_grace": 0.05})
    await run.reaches(S.READY)
    leave = asyncio.Event()

    async def request() -> None:
        async with run.sup.served.relaying():
            await leave.wait()

    client = asyncio.create_task(request())
    await run.until(lambda: run.sup.requests.in_flight == 1)
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.READY, times=2)
    assert run.transitions == PLANNED_RESTART
    leave.set()
    await client


async def test_a_process_that_ignores_sigterm_is_killed_after_stop_grace(start_target):
    run = start_target(restart={"stop_grace": 0.05})
    await run.reaches(S.READY)
    run.world.ignores_sigterm = True
    proc = run.process
    await run.sup.shutdown("daemon stopping")
    assert proc.signals == ["SIGTERM", "SIGKILL"]


SHUTDOWN = [*START, (S.READY, S.STOPPING), (S.STOPPING, S.STOPPED)]


async def test_shutdown_stops_the_process_and_ends_the_owner_task(start_target):
    run = start_target()
    await run.reaches(S.READY)
    await run.sup.shutdown("daemon stopping")
    assert run.transitions == SHUTDOWN
    assert run.process.signals == ["SIGTERM"] and run.process.returncode == -15
    assert run.sup._task is not None and run.sup._task.done()


async def test_shutdown_while_loading_stops_the_process(start_target):
    run = start_target()
    run.world.readiness = Readiness.LOADING
    await run.reaches(S.LOADING)
    await run.sup.shutdown("daemon stopping")
    assert run.transitions == [(S.STOPPED, S.STARTING), (S.STARTING, S.LOADING),
                               (S.LOADING, S.STOPPING), (S.STOPPING, S.STOPPED)]


async def test_shutdown_while_degraded_stops_the_process(start_target):
    run = start_target(health={"failures": 100})
    await run.reaches(S.READY)
    run.world.readiness = Readiness.UNHEALTHY
    await run.reaches(S.DEGRADED)
    await run.sup.shutdown("daemon stopping")
    assert run.transitions == [*START, (S.READY, S.DEGRADED), (S.DEGRADED, S.STOPPING), (S.STOPPING, S.STOPPED)]


DETACH = [*START, (S.READY, S.DETACHED)]


async def test_detach_leaves_the_process_running(start_target):
    run = start_target(detaches=True)
    await run.reaches(S.READY)
    await run.sup.detach("daemon stopping; stop_targets_on_exit is false")
    assert run.transitions == DETACH
    assert run.process.signals == [] and run.process.returncode is None


async def test_detach_while_loading_or_degraded_leaves_the_process_running(start_target):
    loading = start_target(detaches=True)
    loading.world.readiness = Readiness.LOADING
    await loading.reaches(S.LOADING)
    await loading.sup.detach("daemon stopping")
    degraded = start_target(detaches=True, health={"failures": 100})
    await degraded.reaches(S.READY)
    degraded.world.readiness = Readiness.UNHEALTHY
    await degraded.reaches(S.DEGRADED)
    await degraded.sup.detach("daemon stopping")
    assert loading.transitions[-1] == (S.LOADING, S.DETACHED)
    assert degraded.transitions[-1] == (S.DEGRADED, S.DETACHED)
    assert loading.process.returncode is None and degraded.process.returncode is None


async def test_a_process_that_dies_while_loading_backs_off(start_target):
    run = start_target()
    run.world.readiness = Readiness.LOADING
    await run.reaches(S.LOADING)
    run.process.exit(-11)
    await run.reaches(S.LOADING, times=2)
    assert run.transitions[:4] == [(S.STOPPED, S.STARTING), (S.STARTING, S.LOADING),
                                   (S.LOADING, S.BACKOFF), (S.BACKOFF, S.STARTING)]
    assert "killed by signal SIGSEGV" in run.events[2].reason


# --- the table itself ---

# --- on demand: unloaded, loaded by a request, unloaded again; none of it a restart ---

async def test_an_on_demand_target_loads_at_the_first_request_and_unloads_without_a_restart(
        start_target):
    run = start_target(unloaded=True)
    await run.reaches(S.UNLOADED)
    assert run.world.starts == [] and run.sup.served.unavailable_reason() is None
    assert await run.sup.served.wait_serving(5)  # the request's wait loads it
    run.sup.send(Command.START, "another request")  # while it runs: nothing happens
    run.sup.loading.counted_unload("idle")
    run.sup.send(Command.UNLOAD, "idle for 600 s")
    await run.reaches(S.UNLOADED, times=2)
    assert run.transitions == ON_DEMAND
    assert run.process.signals == ["SIGTERM"] and len(run.world.starts) == 1
    status = run.sup.status()
    assert status.restarts == 0 and status.restarts_by_reason == {}
    assert status.on_demand["loads"] == 1 and status.on_demand["unloads"] == {"idle": 1}
    assert status.on_demand["cold_start_s"] is not None
    assert [e.kind for e in run.events if e.kind == "load"] == ["load"]
    assert await run.sup.served.wait_serving(5)  # and loads again
    assert run.sup.status().on_demand["loads"] == 2


ON_DEMAND = [(S.STOPPED, S.UNLOADED), (S.UNLOADED, S.STARTING), *RESTART_TO_READY,
             (S.READY, S.STOPPING), (S.STOPPING, S.UNLOADED)]


async def test_unloading_a_crashed_target_ends_its_backoff_and_a_failed_one_stays_failed(
        start_target):
    run = start_target(restart={"backoff_initial": 30, "backoff_max": 30})
    await run.reaches(S.READY)
    run.process.exit(1)
    await run.reaches(S.BACKOFF)
    run.sup.send(Command.UNLOAD, "evicted to load other")
    await run.reaches(S.UNLOADED)
    assert run.transitions[-2:] == [(S.READY, S.BACKOFF), (S.BACKOFF, S.UNLOADED)]

    broken = start_target(restart={"max_crashes": 1})
    await broken.reaches(S.READY)
    broken.process.exit(1)
    await broken.reaches(S.FAILED)
    broken.sup.send(Command.UNLOAD, "idle")
    broken.sup.send(Command.RETUNE, "a marker: the unload was handled before it")
    # The owner dispatches each command as it takes it: an empty queue means both were.
    await broken.until(lambda: broken.sup._commands.empty())
    assert broken.sup.state is S.FAILED
    assert broken.sup.served.unavailable_reason() is not None  # requests are not held for it


async def test_a_load_the_fleet_refuses_answers_waiting_requests_at_once(start_target):
    run = start_target(unloaded=True)
    await run.reaches(S.UNLOADED)
    run.sup.loading.load_with(lambda name, reason: run.sup.loading.refuse_load(
        "cannot load: 1.00 GiB short on GPU 0 (held by pinned, not evictable)"))
    assert not await run.sup.served.wait_serving(5)
    assert run.sup.served.unavailable_reason() == ("unloaded: cannot load: 1.00 GiB short on GPU 0 "
                                            "(held by pinned, not evictable)")
    assert run.transitions == [(S.STOPPED, S.UNLOADED)]


SCENARIOS = [START, CRASH_AND_RESTART, UNREACHABLE_THEN_UP, LOADING_CRASH_LOOP, READY_TO_FAILED, DEGRADED_AND_BACK,
             HANG, PLANNED_RESTART, SHUTDOWN, DETACH, ON_DEMAND, [(S.BACKOFF, S.UNLOADED)],
             [(S.STARTING, S.FAILED), (S.FAILED, S.STARTING), (S.BACKOFF, S.STOPPED),
              (S.LOADING, S.STOPPING), (S.DEGRADED, S.STOPPING), (S.DEGRADED, S.FAILED),
              (S.LOADING, S.DETACHED), (S.DEGRADED, S.DETACHED), (S.STOPPING, S.FAILED),
              (S.BACKOFF, S.FAILED)],
             # A shutdown or an unload while a ModelKit is pulled (tests/supervision/test_pulling.py).
             [(S.STARTING, S.STOPPED), (S.STARTING, S.UNLOADED)],
             # Waiting for what the host lacks (the tests above on files and ports).
             [(S.LOADING, S.WAITING), (S.WAITING, S.UNLOADED), (S.WAITING, S.STOPPED),
              (S.WAITING, S.FAILED)],
             # A reload that changed a failed target which loads on demand (test_handover.py).
             [(S.FAILED, S.UNLOADED)]]


def test_every_allowed_transition_is_exercised_by_a_scenario_above():
    allowed = {(old, new) for old, news in ALLOWED.items() for new in news}
    asserted = {edge for scenario in SCENARIOS for edge in scenario}
    assert asserted == allowed, (f"never exercised: {sorted(allowed - asserted)}; "
                                 f"not allowed: {sorted(asserted - allowed)}")


# --- internal errors: the target fails, visibly, alone ---

async def test_an_unexpected_exception_at_start_fails_the_target_with_its_text(
        start_target, monkeypatch):
    async def broken_start(self: FakeLauncher, name: str, spec: Any, **kw: Any) -> Any:
        raise ValueError("illegal environment variable name")
    healthy = start_target()
    await healthy.reaches(S.READY)
    monkeypatch.setattr(FakeLauncher, "start", broken_start)
    broken = start_target()
    await broken.reaches(S.FAILED)
    assert broken.transitions == INTERNAL_ERROR_AT_START
    assert "ValueError('illegal environment variable name')" in broken.events[-1].reason
    assert broken.sup.served.unavailable_reason() is not None
    monkeypatch.undo()
    broken.sup.send(Command.RESTART, "restart requested through the API")
    await broken.reaches(S.READY)
    await healthy.reaches(S.READY)
    assert healthy.transitions == START  # the other target never noticed


INTERNAL_ERROR_AT_START = [(S.STOPPED, S.STARTING), (S.STARTING, S.FAILED)]


async def test_an_exception_while_stopping_fails_the_target_instead_of_hanging(
        start_target, monkeypatch):
    run = start_target()
    await run.reaches(S.READY)

    async def broken_stop(self: FakeProcess, grace: float) -> int:
        raise RuntimeError("the stop went wrong")
    monkeypatch.setattr(FakeProcess, "stop", broken_stop)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.reaches(S.FAILED)
    assert run.transitions == [*START, (S.READY, S.STOPPING), (S.STOPPING, S.FAILED)]
    assert run.process.signals == ["SIGKILL"]  # its process did not outlive the error


async def test_an_exception_during_backoff_fails_the_target(start_target, monkeypatch):
    run = start_target(restart={"backoff_initial": 60, "backoff_max": 60})
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.BACKOFF)

    def broken_apply(self: Any) -> None:
        raise KeyError("pending")
    monkeypatch.setattr(type(run.sup.tuner), "apply_pending", broken_apply)
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.FAILED)
    assert run.transitions == [*START, (S.READY, S.BACKOFF), (S.BACKOFF, S.FAILED)]


# --- the proxy's view: wait only for a target that is coming back ---

async def test_waiting_for_a_failed_target_returns_at_once_with_the_reason(start_target):
    run = start_target(restart={"max_crashes": 1})
    await run.reaches(S.READY)
    run.process.exit(1)
    await run.reaches(S.FAILED)
    # Asked to wait an hour: only an immediate answer gets past the hang guard.
    async with asyncio.timeout(30):
        assert await run.sup.served.wait_serving(3600) is False
    assert (run.sup.served.unavailable_reason() or "").startswith("failed: fake-runtime exited")


async def test_waiting_for_a_restarting_target_waits_until_it_serves(start_target):
    run = start_target(restart={"backoff_initial": 0.2, "backoff_max": 0.2})
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.BACKOFF)
    assert run.sup.served.unavailable_reason() is None  # backing off: it is coming back
    assert await run.sup.served.wait_serving(5) is True


# --- what the status says about restarts and about a process that is not serving ---

async def test_every_restart_is_counted_by_its_reason(start_target):
    run = start_target()
    await run.reaches(S.READY)
    run.process.exit(-9)
    await run.reaches(S.READY, times=2)
    run.sup.send(Command.RESTART, "restart requested through the API")
    await run.reaches(S.READY, times=3)
    run.sup.send(Command.RETUNE, "draft length 8 -> 4")
    await run.reaches(S.READY, times=4)
    status = run.sup.status()
    assert status.restarts == 1  # the restart policy's, as before
    assert status.restarts_by_reason == {"crash": 1, "restart": 1, "retune": 1}


async def test_a_target_that_is_not_serving_shows_no_stale_rates_or_memory(start_target):
    run = start_target(speculation={"method": "ngram", "length": {"start": 4}},
                       health={"metrics_interval": 0.01})
    run.world.metrics = MetricsSample(process_start=1.0, drafts=10, draft_tokens=40,
                                      accepted_tokens=20, tokens_predicted=100,
                                      tokens_predicted_seconds=2.0)
    await run.reaches(S.READY)
    await run.until(lambda: run.sup.status().shown["acceptance_rate"] is not None)
    run.sup.resources = {"rss_bytes": 123}
    run.world.readiness = Readiness.LOADING
    run.process.exit(-9)
    await run.reaches(S.LOADING, times=2)
    status = run.sup.status()
    assert status.shown["acceptance_rate"] is None and status.shown["tokens_per_second"] is None
    assert status.shown["draft_length"] == 4  # the setting is no measurement: still shown
    run.process.exit(-9)
    await run.reaches(S.BACKOFF, times=2)
    assert run.sup.status().resources == {}  # no process, no memory


async def test_the_draft_length_shown_is_the_runtimes_default_when_none_is_set(
        start_target, monkeypatch):
    monkeypatch.setattr(FakeBackend, "default_length", lambda self: 64)
    run = start_target(speculation={"method": "ngram"})
    await run.reaches(S.READY)
    status = run.sup.status()
    assert status.speculation["draft_length"] is None  # nothing configured
    assert status.shown["draft_length"] == 64  # but it runs with 64


async def test_a_busy_server_that_answers_late_is_not_killed_but_a_stopped_one_is(
        start_target):
    # A real process burning CPU stands for a server generating for many clients while its
    # health checks time out; SIGSTOP then freezes it, as a hung server.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run = start_target(health={"failures": 3})
        await run.reaches(S.READY)
        run.process.pid = busy.pid
        run.world.probe_hangs = True
        await run.reaches(S.DEGRADED)
        probes = run.world.probes
        await run.until(lambda: run.world.probes >= probes + 12)  # four streaks of three
        assert run.sup.state == S.DEGRADED  # still alive: it is busy, not hung
        os.kill(busy.pid, signal.SIGSTOP)
        await run.reaches(S.BACKOFF)
        backoff = next(e for e in run.events if e.new == "backoff")
        assert "uses no CPU: treating it as hung" in backoff.reason
    finally:
        busy.kill()
        busy.wait()
