"""An installable release: the wheel built from the checkout, installed into a fresh virtual
environment outside it (as pipx does), runs `specfleet` with its shipped examples and
status page, with nothing read from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO


def run(*argv: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False, env=env)


def test_the_wheel_installed_outside_the_checkout_ships_its_examples_and_checks_them(
        tmp_path, llama_server_bin, gemma_model):
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps",
                "-w", tmp_path / "dist", REPO, cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("specfleet-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "supervisor/examples/quickstart.yaml" in names
    assert "supervisor/api/ui/index.html" in names or any(n.startswith("supervisor/api/ui/")
                                                          for n in names)
    assert not any(n.startswith("tests/") or n.startswith("benchmarks/") for n in names)

    made = run(sys.executable, "-m", "venv", tmp_path / "env", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    pip = tmp_path / "env" / "bin" / "pip"
    installed = run(pip, "install", "--quiet", wheel, cwd=tmp_path, timeout=1200)
    assert installed.returncode == 0, installed.stderr[-2000:]

    specfleet = tmp_path / "env" / "bin" / "specfleet"
    away = tmp_path / "elsewhere"  # not the checkout: nothing may come from it
    away.mkdir()
    assert run(specfleet, "--version", cwd=away).stdout.startswith("specfleet ")
    listed = run(specfleet, "examples", cwd=away)
    assert listed.returncode == 0 and "quickstart.yaml" in listed.stdout
    assert str(tmp_path / "env") in listed.stdout  # from the installed package
    copied = run(specfleet, "examples", "--copy", away / "fleets", cwd=away)
    assert copied.returncode == 0, copied.stderr
    checked = run(specfleet, "check", away / "fleets" / "quickstart.yaml", cwd=away)
    assert checked.returncode == 0, checked.stderr
    assert "gemma" in checked.stdout
    again = run(specfleet, "examples", "--copy", away / "fleets", cwd=away)
    assert "left alone (already there): " in again.stdout
