"""The state dir when it is full, read-only or holds corrupt files (issue 12, items 2 and 9).

A full disk is a real small filesystem: a tmpfs mounted on a temporary directory (root
only; elsewhere these tests are skipped and say why).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from supervisor.atomicfile import write_json, write_text
from supervisor.events import Event, EventLog
from supervisor.launcher.children import ChildRegistry
from supervisor.supervision.runrecord import RunRecorder
from supervisor.tuning.store import TunerMemory, TuningStore
from tests.conftest import REPO, llama_target, wait_for, write_fleet


def specfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True,
                          text=True, cwd=REPO, check=False)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted after the test."""
    mnt = tmp_path / "statefs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path) -> Path:
    """Fill `fs` to the last block; delete the returned file to make room again."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 16, 1 << 12):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


class Recorded:
    """The daemon's emit, as StateDirHealth calls it: every event's reason, in order."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, kind: str, reason: str, detail: str | None = None,
                 data: dict[str, Any] | None = None) -> None:
        assert kind == "daemon"
        self.reasons.append(reason)


def temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob(".*")]


# --- a full disk: the writers ---


def test_the_atomic_writer_leaves_no_temporary_file_and_the_old_content_on_a_full_disk(small_fs):
    target = small_fs / "status.json"
    write_text(target, "old")
    fill(small_fs)
    with pytest.raises(OSError) as raised:
        write_json(target, {"big": "x" * 100_000})
    assert raised.value.errno == errno.ENOSPC
    assert temp_files(small_fs) == []
    assert target.read_text() == "old"


def test_a_full_state_dir_is_reported_once_when_it_starts_failing_and_once_when_it_recovers(
        small_fs):
    from supervisor.daemon.statedir import StateDirHealth

    emit = Recorded()
    health = StateDirHealth(small_fs, emit)
    n = [0]

    def write() -> None:
        n[0] += 1
        write_json(small_fs / "status.json", {"n": n[0], "pad": "x" * 5000})

    assert health.attempt("status.json", write) and health.problem is None
    filler = fill(small_fs)
    for _ in range(5):
        assert not health.attempt("status.json", write)
    assert health.problem is not None
    assert health.problem.startswith("state dir not writable: No space left on device")
    assert len(emit.reasons) == 1 and emit.reasons[0].startswith(health.problem)
    filler.unlink()
    health.retry()  # what the daemon does at each status refresh
    assert health.problem is None
    assert len(emit.reasons) == 2 and "writable again" in emit.reasons[1]
    assert json.loads((small_fs / "status.json").read_text())["n"] == n[0]
    assert temp_files(small_fs) == []


def test_every_writer_of_the_state_dir_keeps_going_on_a_full_disk_and_catches_up_after(
        small_fs, tmp_path):
    from supervisor.daemon.statedir import StateDirHealth

    emit = Recorded()
    health = StateDirHealth(small_fs, emit)
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    store = TuningStore(small_fs / "tuning.json", health)
    children = ChildRegistry(small_fs / "children.json", health)
    records = RunRecorder(small_fs, health)
    events = EventLog(small_fs / "events.jsonl", health)
    filler = fill(small_fs)

    store.save("chat", TunerMemory("cfg", setting=7))
    children.add("chat", os.getpid())
    digest = records.digest(str(model))
    events.append(Event("chat", "state", "written while the disk was full"))
    assert health.problem is not None and len(emit.reasons) == 1
    assert temp_files(small_fs) == []

    filler.unlink()
    health.retry()
    assert health.problem is None, health.problem
    assert TuningStore(small_fs / "tuning.json").load("chat", "cfg").setting == 7
    assert json.loads((small_fs / "children.json").read_text())["chat"]["pid"] == os.getpid()
    assert digest in json.loads((small_fs / "hashes.json").read_text()).values()
    assert "written while the disk was full" in (small_fs / "events.jsonl").read_text()
    assert len(emit.reasons) == 2
    events.close()


# --- a full disk: the daemon ---


def api_get(api: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{api}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def log_events(stderr: Path) -> list[str]:
    out = []
    for line in stderr.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line).get("event", ""))
        except ValueError:
            continue
    return out


def test_a_full_state_dir_keeps_every_target_supervised_and_healthz_says_why(
        small_fs, tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)},
                        state_dir=str(small_fs), log_dir=str(tmp_path / "logs"))
    api = yaml.safe_load(fleet.read_text())["daemon"]["api"]
    daemon = start_daemon(fleet)
    first = daemon.wait_state("chat", "ready")["pid"]
    filler = fill(small_fs)

    os.kill(first, signal.SIGKILL)  # a crash while nothing can be written: still restarted

    def restarted() -> int | None:
        assert daemon.proc.poll() is None, daemon.log()
        chat = api_get(api, "/v1/targets/chat")
        return chat["pid"] if chat["state"] == "ready" and chat["pid"] != first else None

    second = wait_for(restarted, 60, "the restart with a full state dir")
    health = api_get(api, "/healthz")
    assert health["status"].startswith("state dir not writable: No space left on device")
    assert temp_files(small_fs) == []
    shown = specfleet("status", "--state-dir", str(small_fs))
    assert "state dir not writable" in shown.stdout, shown.stdout + shown.stderr

    filler.unlink()
    wait_for(lambda: api_get(api, "/healthz")["status"] == "ok", 15, "the state dir to recover")
    wait_for(lambda: daemon.target("chat").get("pid") == second, 15, "status.json rewritten")
    said = log_events(daemon.stderr_path)
    assert len([e for e in said if e.startswith("state dir not writable")]) == 1, said
    assert len([e for e in said if "writable again" in e]) == 1, said
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize("how", ["full", "read-only", "cannot be created"])
def test_a_daemon_started_on_an_unwritable_state_dir_exits_1_with_one_line(
        how, small_fs, tmp_path, model, llama_server_bin):
    state_dir = small_fs / "state" if how == "cannot be created" else small_fs
    if how == "full":
        fill(small_fs)
    else:
        subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)},
                        state_dir=str(state_dir), log_dir=str(tmp_path / "logs"))
    done = subprocess.run([sys.executable, "-m", "supervisor", "run", str(fleet), "--json-logs"],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specfleet: "), done.stderr
    assert ("No space left on device" if how == "full" else "Read-only file system") in lines[0]
    assert str(state_dir) in lines[0]


# --- corrupt state files ---

GARBAGE = {"binary garbage": b"\xff\xfe\x00\x81garbage", "text that is not JSON": b"{not json",
           "a JSON list": b"[1, 2, 3]", "an object of the wrong shape": b'{"daemon": [], "targets": 3}'}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_status_says_a_corrupt_status_file_is_unreadable_and_treats_it_as_no_status(
        kind, tmp_path):
    (tmp_path / "status.json").write_bytes(GARBAGE[kind])
    out = specfleet("status", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert f"status file {tmp_path / 'status.json'} is unreadable" in out.stderr, out.stderr


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_check_says_a_corrupt_status_file_is_unreadable_and_goes_on(
        kind, tmp_path, model, llama_server_bin):
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)})
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "status.json").write_bytes(GARBAGE[kind])
    out = specfleet("check", str(fleet))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "status.json is unreadable" in out.stderr
    assert "llama-server --model" in out.stdout


def test_status_says_when_a_running_daemon_has_not_rewritten_its_status_file(tmp_path):
    import psutil

    me = psutil.Process()  # a running process stands for the daemon that wrote the file
    daemon = {"pid": me.pid, "create_time": me.create_time(), "started": time.time() - 600,
              "updated": time.time() - 120, "status": "ok"}
    (tmp_path / "status.json").write_text(json.dumps({"daemon": daemon, "targets": []}))
    out = specfleet("status", "--state-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "the status file was last written 12" in out.stdout  # 120 s and the run time
    assert "may not be able to write its state dir" in out.stdout


CORRUPT = {"tuning.json": b"\x00\xff not json", "children.json": b"[1, 2, 3]",
           "hashes.json": b'{"truncated', "events.jsonl": b'{"kind": "state"}\nnot json\n'}


def kept_copies(state_dir: Path, name: str) -> list[bytes]:
    return [p.read_bytes() for p in state_dir.glob(f"{name}.corrupt-*")]


def test_each_corrupt_state_file_is_kept_aside_reported_once_and_replaced_by_empty_state(tmp_path):
    from supervisor.daemon.statedir import StateDirHealth

    for name, content in CORRUPT.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "model.bin").write_bytes(b"weights")
    emit = Recorded()
    health = StateDirHealth(tmp_path, emit)
    store = TuningStore(tmp_path / "tuning.json", health)
    for _ in range(3):
        assert store.load("chat", "cfg") == TunerMemory("cfg")
    assert ChildRegistry(tmp_path / "children.json", health).sweep() == []
    RunRecorder(tmp_path, health).digest(str(tmp_path / "model.bin"))
    log = EventLog(tmp_path / "events.jsonl", health)
    log.append(Event("chat", "state", "after"))
    log.close()
    for name, content in CORRUPT.items():
        assert kept_copies(tmp_path, name) == [content], name
        assert len([r for r in emit.reasons if r.startswith(f"{name} ")]) == 1, emit.reasons
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert lines[-1]["reason"] == "after"


def test_the_daemon_starts_over_corrupt_state_files_warns_once_each_and_keeps_copies(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)})
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    for name, content in CORRUPT.items():
        (state_dir / name).write_bytes(content)
    daemon = start_daemon(fleet)
    daemon.wait_state("chat", "ready")
    wait_for(lambda: json.loads((state_dir / "runs" / "chat.json").read_text())["files"]
             ["model"]["sha256"], 60, "the model's digest (which reads hashes.json)")
    said = log_events(daemon.stderr_path)
    reasons = [e["reason"] for e in daemon.events() if e["kind"] == "daemon"]
    for name, content in CORRUPT.items():
        assert kept_copies(state_dir, name) == [content], name
        assert len([e for e in said if e.startswith(f"{name} ")]) == 1, said
        assert len([r for r in reasons if r.startswith(f"{name} ")]) == 1, reasons
    assert isinstance(json.loads((state_dir / "hashes.json").read_text()), dict)
    assert "Traceback" not in daemon.log()


def test_a_runtime_log_on_a_full_disk_drops_lines_from_the_file_not_the_target(
        small_fs, capsys):
    from supervisor.launcher.outputlog import OutputLog

    log = OutputLog(small_fs / "logs" / "t.log", 10 * 1024 * 1024, 1)
    filler = fill(small_fs)
    for n in range(200):
        log.write(f"line {n} " + "x" * 200)
    log.close()
    assert list(log.tail)[-1].startswith("line 199")  # the tail still has them
    assert "Logging error" not in capsys.readouterr().err  # no traceback per line
    filler.unlink()
    (small_fs / "a-file").write_text("")
    uncreatable = OutputLog(small_fs / "a-file" / "t.log", 1024, 1)  # its dir cannot exist
    uncreatable.write("still kept")
    uncreatable.close()
    assert list(uncreatable.tail) == ["still kept"]


def test_a_torn_last_event_line_costs_that_line_not_the_history(tmp_path):
    from supervisor.daemon.statedir import StateDirHealth

    good = [json.dumps({"target": "chat", "kind": "state", "reason": f"r{n}"}) for n in range(42)]
    torn = '{"target": "chat", "kind": "sta'
    (tmp_path / "events.jsonl").write_text("\n".join(good) + "\n" + torn)
    emit = Recorded()
    log = EventLog(tmp_path / "events.jsonl", StateDirHealth(tmp_path, emit))
    log.append(Event("chat", "state", "after"))
    log.close()
    lines = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["reason"] for e in lines] == [f"r{n}" for n in range(42)] + ["after"]
    assert kept_copies(tmp_path, "events.jsonl")[0].endswith(torn.encode())
    assert len(emit.reasons) == 1 and "line 43 is not a JSON object" in emit.reasons[0]
