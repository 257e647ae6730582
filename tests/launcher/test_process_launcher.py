"""The process launcher with real processes: groups, stop escalation, logs, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from supervisor.launcher.children import ChildRegistry
from supervisor.launcher.process import ProcessLauncher
from supervisor.plugin.backend import LaunchSpec
from tests.conftest import REPO, eventually, wait_for


def launcher(tmp_path, **kw) -> ProcessLauncher:
    return ProcessLauncher(tmp_path / "logs", tmp_path / "state", **kw)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_stop_takes_the_whole_process_group_including_grandchildren(tmp_path):
    spec = LaunchSpec(("sh", "-c", "sleep 300 & echo grandchild $!; wait"))
    child = await launcher(tmp_path).start("grp", spec)
    await eventually(lambda: "grandchild" in child.output_tail(), what="the grandchild's pid")
    grandchild = int(child.output_tail().split()[-1])
    assert psutil.pid_exists(grandchild)
    code = await child.stop(grace=5)
    assert code == -signal.SIGTERM
    wait_for(lambda: gone(grandchild), 5, "the grandchild to die")


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    spec = LaunchSpec(("sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"))
    child = await launcher(tmp_path).start("stubborn", spec)
    await eventually(lambda: "ready" in child.output_tail(), what="its trap to be set")
    code = await child.stop(grace=0.5)
    assert code == -signal.SIGKILL


async def test_a_server_that_stops_on_sigint_gets_sigint_when_its_spec_says_so(tmp_path):
    # SIGTERM ignored, SIGINT a clean exit: only the spec's stop signal ends it in time.
    # The daemon may itself have SIGINT ignored (started as `specfleet run ... &` from a
    # script): the server must not inherit that, or its shell could not even trap it.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        await _stops_on_sigint(tmp_path)
    finally:
        signal.signal(signal.SIGINT, before)


async def _stops_on_sigint(tmp_path):
    spec = LaunchSpec(("sh", "-c", "trap '' TERM; trap 'echo bye; exit 3' INT; echo ready; "
                       "while :; do sleep 0.1; done"), stop_signal="SIGINT")
    child = await launcher(tmp_path).start("polite", spec)
    await eventually(lambda: "ready" in child.output_tail(), what="its traps to be set")
    assert await child.stop(grace=5) == 3
    assert "bye" in child.output_tail()


async def test_a_stopped_process_is_still_stopped_promptly(tmp_path):
    child = await launcher(tmp_path).start("frozen", LaunchSpec(("sleep", "300")))
    os.kill(child.pid, signal.SIGSTOP)
    assert await child.stop(grace=5) == -signal.SIGTERM


async def test_output_goes_to_a_rotating_log_and_its_tail_is_kept(tmp_path):
    lx = launcher(tmp_path, max_bytes=2000, backups=2)
    spec = LaunchSpec(("sh", "-c", "for i in $(seq 1 300); do echo line $i; done; "
                                   "echo oops >&2; exit 3"))
    child = await lx.start("chatty", spec)
    assert await child.wait() == 3
    assert child.output_tail(2) == "line 300\noops"
    log = lx.log_path("chatty")
    assert log.with_name("chatty.log.1").exists()
    assert not log.with_name("chatty.log.3").exists()
    assert log.stat().st_size <= 2000 + 200
    assert "exited with status 3" in log.read_text()


async def test_environment_and_files_reach_the_child(tmp_path):
    modelfile = tmp_path / "gen" / "Modelfile"
    spec = LaunchSpec(("sh", "-c", f"echo $SF_TEST_VALUE; cat {modelfile}"),
                      env={"SF_TEST_VALUE": "hello"}, files={str(modelfile): "FROM x\n"})
    child = await launcher(tmp_path).start("env", spec)
    await child.wait()
    assert child.output_tail() == "hello\nFROM x"



async def test_a_background_child_and_its_threads_run_at_the_lowest_priority(tmp_path):
    # A thread started after exec inherits the nice set before it; the child's session
    # (its own autogroup) is lowered too where the kernel has autogroups.
    spec = LaunchSpec((sys.executable, "-c", "import threading, time; "
                       "threading.Thread(target=time.sleep, args=(30,)).start(); "
                       "time.sleep(30)"))
    lx = launcher(tmp_path)
    child = await lx.start("calibration", spec, background=True)
    plain = await lx.start("serving", LaunchSpec(("sleep", "30")))
    try:
        proc = psutil.Process(child.pid)
        wait_for(lambda: proc.num_threads() == 2, 10, "the child's second thread")
        assert {psutil.Process(t.id).nice() for t in proc.threads()} == {19}
        assert psutil.Process(plain.pid).nice() == psutil.Process().nice()
        autogroup = f"/proc/{child.pid}/autogroup"
        if Path(autogroup).exists():
            assert Path(autogroup).read_text().split()[-2:] == ["nice", "19"]
    finally:
        await child.stop(1)
        await plain.stop(1)

DAEMON_STANDIN = """
import asyncio, sys
from pathlib import Path
from supervisor.plugin.backend import LaunchSpec
from supervisor.launcher.process import ProcessLauncher

async def main():
    lx = ProcessLauncher(Path(sys.argv[1]) / "logs", Path(sys.argv[1]) / "state")
    child = await lx.start("sleeper", LaunchSpec(("sleep", "300")))
    print(child.pid, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def test_a_sigkilled_daemon_leaves_no_child_behind(tmp_path):
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON_STANDIN, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    child_pid = int(daemon.stdout.readline())
    assert psutil.pid_exists(child_pid)
    daemon.kill()
    daemon.wait()
    daemon.stdout.close()
    wait_for(lambda: gone(child_pid), 5, "the child to die with its daemon")


def test_the_orphan_sweep_kills_recorded_groups_and_spares_recycled_pids(tmp_path):
    registry = ChildRegistry(tmp_path / "children.json")
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    registry.add("left-behind", orphan.pid)
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    registry.add("recycled", bystander.pid)
    data = registry._read()
    data["recycled"]["start_ticks"] -= 1000  # as if the pid now belonged to someone else
    registry._write(data)

    killed = registry.sweep()
    assert killed == [f"left-behind (pid {orphan.pid})"]
    assert orphan.wait(5) == -signal.SIGKILL
    time.sleep(0.1)
    assert bystander.poll() is None
    bystander.kill()
    bystander.wait()
    assert registry._read() == {}


def test_two_children_of_one_target_are_both_recorded_and_swept(tmp_path):
    """A new server started beside the old one (supervision/handover.py): for a while one
    target has two children, and an unclean death of the daemon must not spare either."""
    registry = ChildRegistry(tmp_path / "children.json")
    old = subprocess.Popen(["sleep", "300"], start_new_session=True)
    new = subprocess.Popen(["sleep", "300"], start_new_session=True)
    registry.add("t", old.pid)
    registry.add("t", new.pid)
    assert len(registry._read()) == 2
    killed = registry.sweep()
    assert sorted(killed) == sorted([f"t (pid {old.pid})", f"t (pid {new.pid})"])
    assert old.wait(5) == new.wait(5) == -signal.SIGKILL
    # Removal by pid: the old one's exit leaves the new one's record.
    registry.add("t", 1)  # (any pid: only the record matters here)
    registry.add("t", os.getpid())
    registry.remove("t", 1)
    assert [e["pid"] for e in registry._read().values()] == [os.getpid()]


@pytest.mark.parametrize("argv", [("/nonexistent/llama-server",)])
async def test_a_missing_executable_raises_oserror_for_the_supervisor_to_report(tmp_path, argv):
    with pytest.raises(OSError):
        await launcher(tmp_path).start("missing", LaunchSpec(argv))
