"""The backend contract is open to third parties: the example package under examples/ is
installed (pip, into a directory of its own), found through the entry-point group and
supervised exactly like a built-in backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import (
    FAST_HEALTH,
    FAST_RESTART,
    REPO,
    free_port,
    pip_install_plugin,
    wait_for,
    write_fleet,
)

PACKAGE = REPO / "examples" / "specfleet-openai-command"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    return pip_install_plugin(PACKAGE, tmp_path, monkeypatch)


def test_the_example_backend_is_installed_and_a_target_on_it_is_supervised(
        tmp_path, installed, model, llama_server_bin, start_daemon):
    port = free_port()
    fleet = write_fleet(tmp_path, {"generic": {
        "backend": "openai-command", "model": "gemma", "port": port,
        "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART),
        "options": {"command": [llama_server_bin, "-m", model, "--host", "{host}", "--port",
                                "{port}", "--ctx-size", "2048", "--threads", "1"]}}})
    checked = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                             capture_output=True, text=True, cwd=REPO, check=False)
    assert checked.returncode == 0, checked.stderr
    assert "backend openai-command" in checked.stdout and f"--port {port}" in checked.stdout

    daemon = start_daemon(fleet)
    pid = daemon.wait_state("generic", "ready")["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (t := daemon.target("generic")).get("state") == "ready" and t["pid"] != pid,
             60, "the plugin's target to be restarted")
    assert daemon.target("generic")["restarts"] == 1


def test_the_example_backends_own_checks_reach_the_fleet_file_errors(tmp_path, installed):
    fleet = write_fleet(tmp_path, {"generic": {"backend": "openai-command", "model": "m",
                                               "port": free_port(),
                                               "options": {"command": "server --port 1"}}})
    checked = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                             capture_output=True, text=True, cwd=REPO, check=False)
    assert checked.returncode == 2
    assert "targets.generic.options.command: expected the server's command as a list" \
        in checked.stderr
