"""A real systemd system manager (252, with D-Bus and journald) as PID 1 of private
namespaces, for the systemd launcher's tests; the scripts in tests/systemd-lab/ are the
recipe for running a real systemd manager on these machines, kept in the project because
its tests depend on them.

Rules (they protect the machine): only this recipe; PIDs inside are namespace PIDs, so
anything that signals a unit's process runs inside (`lab.run(...)`); the manager is
always stopped (it kills everything inside, then removes its cgroup).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import REPO, DaemonProcess, wait_for

LAB = Path(__file__).resolve().parent / "systemd-lab"


class Lab:
    def __init__(self, directory: Path) -> None:
        out = subprocess.run([str(LAB / "start-sys.sh"), str(directory)], capture_output=True,
                             text=True, check=False, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"the systemd lab did not start:\n{out.stdout}\n{out.stderr}")
        values = dict(re.findall(r"(\w+)=(\S+)", out.stdout))
        self.pid, self.cgroup = int(values["SDLAB_PID"]), values["SDLAB_CG"]
        self.bus = values["DBUS_SYSTEM_BUS_ADDRESS"]

    def ns(self, *argv: str) -> list[str]:
        """argv to run inside the lab, with the standard bus paths."""
        return ["nsenter", "-t", str(self.pid), "-a", f"--wd={REPO}", "env", "-u",
                "DBUS_SYSTEM_BUS_ADDRESS", *argv]

    def run(self, *argv: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.ns(*argv), capture_output=True, text=True, input=input,
                              check=False, timeout=60)

    def show(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", unit, "-p", prop, "--value").stdout.strip()

    def stop(self) -> None:
        subprocess.run([str(LAB / "stop-sys.sh"), str(self.pid), self.cgroup], check=False,
                       timeout=60)


class LabDaemon(DaemonProcess):
    """`specfleet run FILE` inside the lab (nsenter forks it into the lab's pid namespace)."""

    def __init__(self, fleet: Path, lab: Lab) -> None:
        self.lab = lab
        self._argv = lab.ns(sys.executable, "-m", "supervisor", "run", str(fleet), "--json-logs")
        super().__init__(fleet)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                stdin=subprocess.DEVNULL, cwd=REPO)

    def host_pid(self) -> int:
        """The daemon's pid as this (host) side sees it: nsenter's child."""
        def find() -> int | None:
            for child in psutil.Process(self.proc.pid).children():
                return child.pid
            return None
        return wait_for(find, 10, "the daemon inside the lab")

    def signal(self, sig: int) -> None:
        os.kill(self.host_pid(), sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, AssertionError, psutil.Error):
                for child in psutil.Process(self.proc.pid).children():
                    child.kill()
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()
        return self.proc.returncode


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    started = Lab(tmp_path / "sdlab")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def lab_daemon(lab: Lab, tmp_path: Path) -> Iterator[Any]:
    daemons: list[LabDaemon] = []

    def start(fleet: Path) -> LabDaemon:
        d = LabDaemon(fleet, lab)
        daemons.append(d)
        return d

    yield start
    for d in daemons:
        d.stop()


def wait_unit(lab: Lab, unit: str, state: str, timeout: float = 30) -> None:
    wait_for(lambda: lab.show(unit, "ActiveState") == state, timeout,
             f"{unit} to be {state} (now {lab.show(unit, 'ActiveState')})")
