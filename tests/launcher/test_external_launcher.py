"""The launcher contract is open to third parties: the example package under examples/ is
installed (pip, into a directory of its own), found through the `specfleet.launchers`
entry points and runs a real target end to end, exactly like a built-in launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import REPO, llama_target, pip_install_plugin, wait_for, write_fleet

PACKAGE = REPO / "examples" / "specfleet-launcher-nice"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    return pip_install_plugin(PACKAGE, tmp_path, monkeypatch)


def check(fleet):
    return subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)


def test_a_third_party_launcher_runs_a_target_end_to_end(
        tmp_path, installed, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"gemma": llama_target(
        model, llama_server_bin, launcher="nice", launcher_settings={"niceness": 15})})
    checked = check(fleet)
    assert checked.returncode == 0, checked.stderr
    assert "launcher nice" in checked.stdout

    daemon = start_daemon(fleet)
    pid = daemon.wait_state("gemma", "ready")["pid"]
    # The runtime is the launcher's: a child of the daemon at the niceness its settings say.
    assert psutil.Process(pid).nice() == 15
    assert psutil.Process(pid).ppid() == daemon.proc.pid
    log = tmp_path / "state" / "logs" / "gemma.log"
    assert log.exists() and "llama" in log.read_text(errors="replace").lower()

    os.kill(pid, signal.SIGKILL)  # a crash is restarted by the owner task, as for any launcher
    again = wait_for(lambda: (t := daemon.target("gemma")).get("state") == "ready"
                     and t["pid"] != pid and t, 90, "the target to be restarted")
    assert again["restarts"] == 1 and psutil.Process(again["pid"]).nice() == 15

    assert daemon.stop() == 0
    assert not psutil.pid_exists(again["pid"]) or \
        psutil.Process(again["pid"]).status() == psutil.STATUS_ZOMBIE


def test_a_launcher_that_is_not_installed_is_a_fleet_file_error(tmp_path, installed, model):
    fleet = write_fleet(tmp_path, {"gemma": llama_target(model, "/bin/true", launcher="nicee")})
    checked = check(fleet)
    assert checked.returncode == 2
    assert "targets.gemma.launcher: launcher 'nicee' is not installed" in checked.stderr
    assert "did you mean 'nice'" in checked.stderr
    assert "Traceback" not in checked.stderr


def test_a_launchers_declared_settings_are_checked_with_the_files_line(
        tmp_path, installed, model):
    """A third-party launcher's settings get what every key gets: the file, the line, the
    dotted path, the bad value and what is valid; exit status 2."""
    for settings, said in (
            ({"niceness": 40}, "targets.gemma.launcher_settings.niceness: "),
            ({"nicenes": 5}, "unknown key 'nicenes' (did you mean 'niceness'?); valid keys: "
                             "niceness"),
            ({"niceness": "low"}, "expected a whole number, got 'low'")):
        fleet = write_fleet(tmp_path, {"gemma": llama_target(
            model, "/bin/true", launcher="nice", launcher_settings=settings)})
        checked = check(fleet)
        assert checked.returncode == 2, checked.stdout
        assert f"{fleet}:" in checked.stderr and said in checked.stderr, checked.stderr
        assert "Traceback" not in checked.stderr
    elsewhere = write_fleet(tmp_path, {"gemma": llama_target(
        model, "/bin/true", launcher_settings={"niceness": 5})})
    checked = check(elsewhere)
    assert checked.returncode == 2
    assert "launcher 'process' takes no launcher_settings" in checked.stderr
