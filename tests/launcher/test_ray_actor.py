"""The actor that holds a runtime on a Ray node, driven directly (it is plain Python; Ray
only hosts it): a real child process, its output lines, its exit status, stop and kill.
The same class under Ray, on a real cluster, is in test_ray_live.py."""

from __future__ import annotations

import asyncio
import signal
import sys

from supervisor.launcher.ray.actor import TargetActor


async def read_all(actor: TargetActor) -> tuple[list[str], int]:
    seen: list[str] = []
    after = 0
    while True:
        after, lines, code = await actor.read(after, 5.0)
        seen += lines
        if code is not None and not lines:
            return seen, code


async def test_the_actor_relays_output_lines_and_the_exit_status() -> None:
    actor = TargetActor("t")
    script = "import sys; print('one'); print('two', flush=True); sys.exit(3)"
    pid = await actor.start([sys.executable, "-c", script], {"X": "1"}, None, "fp")
    assert pid > 0
    lines, code = await read_all(actor)
    assert (lines, code) == (["one", "two"], 3)
    assert await actor.wait() == 3
    assert (await actor.state())["fingerprint"] == "fp"


async def test_a_reader_that_fell_behind_gets_the_kept_lines_and_the_true_count() -> None:
    actor = TargetActor("t")
    await actor.start([sys.executable, "-c", "for i in range(2500): print(i)"], {}, None, "")
    await actor.wait()
    await asyncio.sleep(0.05)
    count, lines, code = await actor.read(0, 0.1)
    assert count == 2500 and len(lines) == 2000 and lines[-1] == "2499" and code == 0


async def test_stop_sends_sigterm_then_sigkill_after_the_grace() -> None:
    actor = TargetActor("t")
    ignores = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ignoring', flush=True); time.sleep(60)")
    await actor.start([sys.executable, "-c", ignores], {}, None, "")
    _, lines, _ = await actor.read(0, 10.0)  # its handler is set once it says so
    assert lines == ["ignoring"]
    assert await actor.stop(0.5) == -signal.SIGKILL


async def test_kill_ends_the_runtime_at_once() -> None:
    actor = TargetActor("t")
    await actor.start([sys.executable, "-c", "import time; time.sleep(60)"], {}, None, "")
    await actor.kill()
    assert await asyncio.wait_for(actor.wait(), 5) == -signal.SIGKILL


async def test_the_nodes_gpus_are_kept_and_the_fleet_files_indices_dropped(monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # as Ray sets it for the actor
    actor = TargetActor("t")
    script = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['Y'])"
    await actor.start([sys.executable, "-c", script], {"CUDA_VISIBLE_DEVICES": "0", "Y": "y"},
                      None, "")
    assert (await read_all(actor))[0] == ["3 y"]
