"""launcher: systemd against a real systemd manager (tests/systemd_lab.py) and the real
llama-server: units visible to systemctl, restarts counted once, adoption after kill -9
of the daemon, leftover units removed, exit semantics, the journal, the watchdog."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from supervisor.launcher.systemd import unitfile
from tests.conftest import (
    REPO,
    llama_target,
    quickstart_fleet,
    runtime_pids,
    wait_for,
    write_fleet,
)
from tests.systemd_lab import wait_unit

SYSTEMD_RESTART = {"backoff_initial": "0.2s", "backoff_max": "2s", "stop_grace": "5s"}


def systemd_target(model, binary, **over):
    return llama_target(model, binary, launcher="systemd", restart=dict(SYSTEMD_RESTART), **over)


def fleet_of(tmp_path, targets, **daemon):
    return write_fleet(tmp_path, targets, **daemon)


def test_rendered_units_pass_systemd_analyze_verify(tmp_path, model, llama_server_bin):
    os.environ["SF_TEST_KEY"] = "s3cret-value"
    fleet = fleet_of(tmp_path, {
        "plain": systemd_target(model, llama_server_bin),
        "ngram": systemd_target(model, llama_server_bin, speculation={"method": "ngram"},
                                api_key={"env": "SF_TEST_KEY"}),
        "child": llama_target(model, llama_server_bin)})
    out = tmp_path / "units"
    done = subprocess.run([sys.executable, "-m", "supervisor", "units", "render", str(fleet),
                           "--dir", str(out)], capture_output=True, text=True, cwd=REPO,
                          check=False)
    assert done.returncode == 0, done.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["specfleet-child.service", "specfleet-ngram.service",
                     "specfleet-plain.service", "specfleet.service", "specfleet.socket"]
    verify = subprocess.run(["systemd-analyze", "verify", *map(str, out.iterdir())],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    daemon_unit = (out / "specfleet.service").read_text()
    assert "Type=notify" in daemon_unit and "WatchdogSec=30s" in daemon_unit
    assert "Requires=specfleet.socket" in daemon_unit
    api, proxy = (yaml.safe_load(fleet.read_text())["daemon"][k] for k in ("api", "proxy"))
    socket_unit = (out / "specfleet.socket").read_text()
    assert f"ListenStream={api}" in socket_unit
    assert f"ListenStream={proxy['listen']}" in socket_unit
    ngram = (out / "specfleet-ngram.service").read_text()
    assert "s3cret-value" not in ngram  # the key lives in a 0600 file, never the unit
    assert f"EnvironmentFile={tmp_path}/state/units-env/ngram.env" in ngram
    assert "Restart=no" in ngram and "KillMode=control-group" in ngram
    assert "TimeoutStopSec=5s" in ngram


def test_quickstart_fleet_on_systemd_reaches_ready_and_systemctl_sees_the_units(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    daemon = lab_daemon(quickstart_fleet(tmp_path, model, llama_server_bin, launcher="systemd"))
    for name in ("gemma-plain", "gemma-ngram"):
        ready = daemon.wait_state(name, "ready")
        unit = unitfile.unit_name(name)
        shown = lab.run("systemctl", "status", unit, "--no-pager")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "active (running)" in shown.stdout
        assert lab.show(unit, "MainPID") == str(ready["pid"])
        assert ready["log_file"] == f"journalctl -u {unit}"
    journal = lab.run("journalctl", "-u", "specfleet-gemma-ngram.service", "-o", "cat",
                      "--no-pager")
    assert "llama_server: model loaded" in journal.stdout  # the runtime's own output


def test_kill_9_of_a_targets_main_process_is_restarted_by_specfleet_once(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    daemon = lab_daemon(fleet_of(tmp_path, {"chat": systemd_target(model, llama_server_bin)}))
    pid = daemon.wait_state("chat", "ready")["pid"]
    assert lab.run("kill", "-9", str(pid)).returncode == 0
    again = wait_for(lambda: (t := daemon.target("chat")).get("state") == "ready"
                     and t["pid"] != pid and t, 60, "the restart")
    assert again["restarts"] == 1
    assert lab.show("specfleet-chat.service", "NRestarts") == "0"  # systemd did not restart it
    # One backoff, from serving: a health probe may meet the closed port (degraded) before
    # the unit's exit is read back from systemd and the journal (CI saw that once).
    assert [(o, n) for o, n in daemon.transitions("chat") if n == "backoff"] in (
        [("ready", "backoff")], [("degraded", "backoff")])
    assert lab.show("specfleet-chat.service", "MainPID") == str(again["pid"])


def test_a_new_daemon_adopts_running_units_after_kill_9_and_removes_units_of_removed_targets(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    targets = {"keep": systemd_target(model, llama_server_bin),
               "drop": systemd_target(model, llama_server_bin)}
    fleet = fleet_of(tmp_path, targets)
    first = lab_daemon(fleet)
    pid = first.wait_state("keep", "ready")["pid"]
    first.wait_state("drop", "ready")
    os.kill(first.host_pid(), signal.SIGKILL)
    first.proc.wait(10)
    wait_unit(lab, "specfleet-keep.service", "active")  # kill -9 of the daemon: units go on
    servers = set(runtime_pids(str(tmp_path)))
    assert len(servers) == 2

    del targets["drop"]
    fleet.write_text(yaml.safe_dump({**yaml.safe_load(fleet.read_text()), "targets": targets},
                                    sort_keys=False))
    second = lab_daemon(fleet)
    adopted = second.wait_state("keep", "ready")
    assert adopted["pid"] == pid  # the same MainPID: adopted, not started again
    assert adopted["restarts"] == 0
    reasons = [e["reason"] for e in second.events("keep") if e["kind"] == "state"]
    assert any("adopted specfleet-keep.service, still running" in r for r in reasons)
    wait_for(lambda: lab.show("specfleet-drop.service", "ActiveState") in ("inactive", ""), 30,
             "the removed target's unit to stop")
    assert lab.run("test", "-e", "/etc/systemd/system/specfleet-drop.service").returncode != 0
    # No second llama-server was started for "keep", and the one of "drop" is gone.
    wait_for(lambda: len(runtime_pids(str(tmp_path))) == 1, 30, "one server left")
    journal = lab.run("journalctl", "-u", "specfleet-keep.service", "-o", "cat", "--no-pager")
    assert "couldn't bind" not in journal.stdout


def test_two_daemons_on_one_manager_never_touch_each_others_units(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    """Two state dirs, each with a systemd target `same`: the second daemon's start is
    refused (the unit names its daemon: X-Specfleet-StateDir) and leaves the first's unit
    running as it was; its other target runs; neither daemon's leftover sweep removes the
    other's units, and the first daemon stopping leaves the second's alone."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first_fleet = fleet_of(one, {"same": systemd_target(model, llama_server_bin)})
    first = lab_daemon(first_fleet)
    pid = first.wait_state("same", "ready")["pid"]
    unit_text = lab.run("cat", "/etc/systemd/system/specfleet-same.service").stdout
    assert f"X-Specfleet-StateDir={one / 'state'}" in unit_text
    second = lab_daemon(fleet_of(two, {"same": systemd_target(model, llama_server_bin),
                                       "other": systemd_target(model, llama_server_bin)}))
    refused = second.wait_state("same", "failed")
    reason = refused["last_event"]["reason"]
    assert "belongs to the specfleet daemon whose state dir is" in reason, reason
    assert str(one / "state") in reason and "rename one of them" in reason
    second.wait_state("other", "ready")
    assert lab.show("specfleet-same.service", "MainPID") == str(pid)  # untouched
    assert lab.run("cat", "/etc/systemd/system/specfleet-same.service").stdout == unit_text
    # The first daemon again (the same file: a new one would pick a new port, a change),
    # after the second started "other": its sweep keeps "other".
    first.stop()
    again = lab_daemon(first_fleet)
    assert again.wait_state("same", "ready")["pid"] == pid  # adopted
    assert lab.show("specfleet-other.service", "ActiveState") == "active"


def test_sigterm_leaves_units_running_unless_stop_targets_on_exit(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    fleet = fleet_of(tmp_path, {"chat": systemd_target(model, llama_server_bin)})
    daemon = lab_daemon(fleet)
    daemon.wait_state("chat", "ready")
    assert daemon.stop() == 0
    assert daemon.target("chat")["state"] == "detached"
    assert lab.show("specfleet-chat.service", "ActiveState") == "active"

    doc = yaml.safe_load(fleet.read_text())
    doc["daemon"]["stop_targets_on_exit"] = True
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    second = lab_daemon(fleet)
    second.wait_state("chat", "ready")
    assert second.stop() == 0
    assert second.target("chat")["state"] == "stopped"
    assert lab.show("specfleet-chat.service", "ActiveState") in ("inactive", "failed")
    assert runtime_pids(str(tmp_path)) == []


def test_a_failed_target_shows_its_last_journal_lines(tmp_path, model, llama_server_bin, lab,
                                                       lab_daemon):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF this is not a model" * 100)
    daemon = lab_daemon(fleet_of(tmp_path, {"broken": systemd_target(str(bad), llama_server_bin)}))
    failed = daemon.wait_state("broken", "failed", 60)
    assert "exiting due to model loading error" in failed["failure_output"]
    shown = subprocess.run([sys.executable, "-m", "supervisor", "status", "--state-dir",
                            str(daemon.state_dir)], capture_output=True, text=True, cwd=REPO,
                           check=False)
    assert "last output of the runtime (journalctl -u specfleet-broken.service)" in shown.stdout
    assert "exiting due to model loading error" in shown.stdout


def test_units_install_writes_the_units_and_the_secret_file_0600_and_reloads(
        tmp_path, model, llama_server_bin, lab):
    fleet = fleet_of(tmp_path, {"chat": systemd_target(model, llama_server_bin,
                                                       api_key={"env": "SF_KEY"})})
    done = lab.run("env", "SF_KEY=k3y", sys.executable, "-m", "supervisor", "units", "install",
                   str(fleet))
    assert done.returncode == 0, done.stderr
    env_file = tmp_path / "state" / "units-env" / "chat.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600 and "k3y" in env_file.read_text()
    assert lab.show("specfleet.service", "LoadState") == "loaded"
    assert lab.show("specfleet-chat.service", "LoadState") == "loaded"
    assert "k3y" not in lab.run("systemctl", "cat", "specfleet-chat.service").stdout


def test_the_watchdog_restarts_a_daemon_whose_event_loop_is_blocked(tmp_path, lab):
    fleet = fleet_of(tmp_path, {})
    unit = unitfile.render_daemon(fleet, watchdog=2, environment={
        "SPECFLEET_FAULT_BLOCK_LOOP_ON_SIGUSR2": "60", "PYTHONPATH": str(REPO)})
    assert lab.run("sh", "-c", "cat > /etc/systemd/system/specfleet.service && "
                   "systemctl daemon-reload", input=unit).returncode == 0
    # Type=notify: `systemctl start` returns once the daemon sent READY=1.
    started = lab.run("systemctl", "start", "specfleet.service")
    assert started.returncode == 0, started.stderr + lab.run(
        "journalctl", "-u", "specfleet", "--no-pager").stdout
    first = lab.show("specfleet.service", "MainPID")
    assert lab.show("specfleet.service", "StatusText") == "0 targets"
    status = json.loads((tmp_path / "state" / "status.json").read_text())
    assert str(status["daemon"]["pid"]) == first  # the unit's main process is the daemon
    assert lab.run("systemctl", "kill", "-s", "SIGUSR2", "--kill-whom=main",
                   "specfleet.service").returncode == 0
    wait_for(lambda: lab.show("specfleet.service", "NRestarts") == "1"
             and lab.show("specfleet.service", "ActiveState") == "active", 30,
             "systemd to restart the daemon")
    assert lab.show("specfleet.service", "MainPID") != first
    journal = lab.run("journalctl", "-u", "specfleet.service", "--no-pager").stdout
    assert "Watchdog timeout" in journal


def test_the_shipped_daemon_unit_template_passes_systemd_analyze_verify(tmp_path):
    template = (REPO / "systemd" / "specfleet.service").read_text()
    assert "Type=notify" in template and "WatchdogSec=" in template
    # verify checks that ExecStart's program exists: point it at this checkout's specfleet.
    here = template.replace("/opt/specfleet/.venv/bin/specfleet",
                            str(Path(sys.executable).parent / "specfleet"))
    unit = tmp_path / "specfleet.service"
    unit.write_text(here)
    socket_unit = tmp_path / "specfleet.socket"
    socket_unit.write_text((REPO / "systemd" / "specfleet.socket").read_text())
    verify = subprocess.run(["systemd-analyze", "verify", str(unit), str(socket_unit)],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr


def test_the_unit_of_a_swapping_target_left_by_a_killed_daemon_is_stopped_at_the_next_start(
        tmp_path, model, llama_server_bin, lab, lab_daemon):
    # It starts `unloaded` (nothing adopts it): left active, it held its port unseen.
    fleet = fleet_of(tmp_path, {"lazy": systemd_target(model, llama_server_bin,
                                                       start="on_demand")})
    first = lab_daemon(fleet)
    first.wait_state("lazy", "unloaded")
    proxy = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    body = json.dumps({"model": "lazy", "prompt": "Hi", "max_tokens": 2}).encode()
    req = urllib.request.Request(f"http://{proxy}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # loads it
        assert json.loads(resp.read())["choices"]
    first.wait_state("lazy", "ready")
    os.kill(first.host_pid(), signal.SIGKILL)
    first.proc.wait(10)
    wait_unit(lab, "specfleet-lazy.service", "active")
    second = lab_daemon(fleet)
    second.wait_state("lazy", "unloaded")
    wait_for(lambda: lab.show("specfleet-lazy.service", "ActiveState") in ("inactive", "failed"),
             30, "the leftover unit to stop")
    assert any("stopped specfleet-lazy.service, left running by an earlier daemon" in e["reason"]
               for e in second.events("lazy")), second.events("lazy")
    wait_for(lambda: runtime_pids(str(tmp_path)) == [], 30, "no server left")


def test_under_the_socket_unit_a_daemon_restart_refuses_no_connection(
        tmp_path, model, llama_server_bin, lab):
    """`systemctl restart specfleet` with specfleet.socket: systemd holds the proxy's
    socket, so requests made while no daemon runs wait and are answered (issue 30, item 5)."""
    import threading
    import time

    fleet = fleet_of(tmp_path, {"chat": llama_target(model, llama_server_bin)})
    proxy = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    done = lab.run(sys.executable, "-m", "supervisor", "units", "install", str(fleet))
    assert done.returncode == 0 and "specfleet.socket specfleet" in done.stdout, done.stderr
    started = lab.run("systemctl", "start", "specfleet.socket", "specfleet.service")
    assert started.returncode == 0, started.stderr
    status = tmp_path / "state" / "status.json"

    def chat() -> dict:
        with contextlib.suppress(OSError, ValueError):
            return next(t for t in json.loads(status.read_text())["targets"]
                        if t["name"] == "chat")
        return {}
    wait_for(lambda: chat().get("state") == "ready", 90, "chat ready under the unit")
    outcomes: list[tuple[float, str]] = []  # (sent at, 200 or what went wrong)
    stop = threading.Event()

    def ask(path: str, body: bytes | None) -> None:
        sent = time.monotonic()
        req = urllib.request.Request(proxy + path, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                answer = json.loads(resp.read())
            ok = "chat" in json.dumps(answer)  # models: its list; completions: its model
            outcomes.append((sent, "200" if ok else f"200 without chat: {answer}"))
        except Exception as exc:  # a refused or reset connection is what this test is about
            outcomes.append((sent, repr(exc)))

    def completions() -> None:
        body = json.dumps({"model": "chat", "prompt": "Once upon a time", "max_tokens": 8,
                           "temperature": 0}).encode()
        while not stop.is_set():
            ask("/v1/completions", body)

    def probes() -> None:  # a new connection every 0.2 s, whatever the others wait for
        while not stop.is_set():
            threading.Thread(target=ask, args=("/v1/models", None), daemon=True).start()
            time.sleep(0.2)
    workers = [threading.Thread(target=completions), threading.Thread(target=completions),
               threading.Thread(target=probes)]
    for w in workers:
        w.start()
    old_pid = lab.show("specfleet.service", "MainPID")
    time.sleep(3)
    restart_began = time.monotonic()
    restarted = lab.run("systemctl", "restart", "specfleet.service")
    restart_ended = time.monotonic()
    assert restarted.returncode == 0, restarted.stderr
    assert lab.show("specfleet.service", "MainPID") != old_pid
    wait_for(lambda: chat().get("state") == "ready", 90, "chat ready after the restart")
    time.sleep(3)
    stop.set()
    for w in workers:
        w.join(150)
    time.sleep(1)
    failed = [o for o in outcomes if o[1] != "200"]
    assert failed == [], failed[:5]
    during = [o for o in outcomes if restart_began <= o[0] <= restart_ended]
    # Sent while the old daemon stopped and the new one started, each answered.
    assert len(during) >= 5, (len(during), restart_ended - restart_began)
    journal = lab.run("journalctl", "-u", "specfleet.service", "--no-pager").stdout
    assert "sockets from systemd" in journal
