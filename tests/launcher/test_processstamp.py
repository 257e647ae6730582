"""A recorded process is recognised by its boot and start tick, so a clock that moves (NTP
slewing across a second, a step) never makes a live daemon read as gone or hides an orphan."""

import subprocess

import psutil
import pytest

from supervisor.daemon.statusfile import daemon_alive
from supervisor.launcher import processstamp


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_stamp_names_the_running_process_and_not_a_recycled_pid(sleeper):
    record = processstamp.stamp(sleeper.pid)
    assert record["pid"] == sleeper.pid and record["start_ticks"] > 0 and record["boot_id"]
    assert processstamp.same_process(record)
    assert not processstamp.same_process({**record, "start_ticks": record["start_ticks"] - 1})
    assert not processstamp.same_process({**record, "boot_id": "another-boot"})
    sleeper.kill()
    sleeper.wait()
    assert not processstamp.same_process(record)


def test_the_stamp_holds_when_the_wall_clock_moves(sleeper, monkeypatch):
    """psutil's create_time is the boot time read now plus the start tick: when NTP moves the
    clock the boot time moves with it. The same process must still be recognised."""
    record = processstamp.stamp(sleeper.pid)
    real = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real() + 1.0)
    assert abs(psutil.Process(sleeper.pid).create_time() - record["create_time"]) >= 0.99
    assert processstamp.same_process(record)
    assert daemon_alive(record)


def test_a_record_written_before_ticks_were_kept_is_compared_by_wall_clock(sleeper):
    legacy = {"pid": sleeper.pid, "create_time": psutil.Process(sleeper.pid).create_time()}
    assert processstamp.same_process(legacy)
    assert processstamp.same_process({**legacy, "create_time": legacy["create_time"] - 1.0})
    assert not processstamp.same_process({**legacy, "create_time": legacy["create_time"] - 60})
    assert not processstamp.same_process({"pid": "x"}) and not processstamp.same_process({})


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path):
    exe = tmp_path / "a (strange) name"
    exe.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(exe), "60"])
    try:
        assert processstamp.start_ticks(proc.pid) is not None
        assert processstamp.same_process(processstamp.stamp(proc.pid))
    finally:
        proc.kill()
        proc.wait()
