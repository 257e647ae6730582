"""The README's two commands are what CI runs, and the set-up says what it could not
install (scripts/system_packages.sh), naming tests that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "system_packages.sh"


def fake_path(tmp_path: Path, tools: list[str]) -> str:
    """A PATH with only `tools` on it (each a do-nothing executable)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).symlink_to("/bin/true")
    return str(bin_dir)


def system_packages(mode: str, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/bash", str(SCRIPT), mode], env={"PATH": path},
                          capture_output=True, text=True, check=False)


def test_the_report_names_what_is_missing_the_tests_that_skip_and_the_command(tmp_path):
    proc = system_packages("report", fake_path(tmp_path, ["podman"]))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Not installed: chromium runc docker-registry prometheus "), lines
    assert lines[-1] == ("To run them: sudo apt-get install chromium runc docker-registry "
                         "prometheus")
    named = re.findall(r"tests/\S+\.py", proc.stdout)
    assert named == ["tests/api/test_ui_browser.py", "tests/launcher/test_container_live.py",
                     "tests/registry/test_registry_live.py", "tests/api/test_keys_live.py"]
    assert all((REPO / name).is_file() for name in named)


def test_nothing_is_reported_or_installed_when_every_package_is_there(tmp_path):
    path = fake_path(tmp_path, ["chromium", "podman", "runc", "docker-registry", "prometheus"])
    assert system_packages("report", path).stdout == ""
    assert system_packages("install", path).stdout == \
        "chromium podman runc docker-registry prometheus: installed\n"


def readme_quick_start() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quick start"):]
    block = section[section.index("```bash\n") + 8:section.index("```", section.index("```bash\n") + 8)]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_quick_start():
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    # The shell preamble, then the two commands; stdin from /dev/null only makes "no
    # terminal" certain wherever CI runs (the quick start then ends by itself).
    assert ci[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."']
    assert [line.removesuffix(" </dev/null") for line in ci[2:]] == readme_quick_start()
    assert readme_quick_start() == ["scripts/quickstart.sh", ".venv/bin/python -m pytest"]
