"""The command line as a sysadmin meets it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from supervisor import __version__
from tests.conftest import REPO


def specfleet(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True,
                          text=True, cwd=REPO, check=False, env=env)


def test_version():
    out = specfleet("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"specfleet {__version__}"


def test_help_explains_the_commands_without_the_readme():
    out = specfleet("--help").stdout
    for word in ("check", "run", "status", "setup", "SIGHUP", "exit status"):
        assert word in out
    run_help = " ".join(specfleet("run", "--help").stdout.split())
    assert "SIGHUP reloads" in run_help


def test_check_prints_the_full_llama_server_command_of_each_quickstart_target(
        gemma_model, llama_server_bin):
    out = specfleet("check", "examples/quickstart.yaml")
    assert out.returncode == 0, out.stderr
    commands = [ln.strip() for ln in out.stdout.splitlines() if "--model" in ln]
    assert len(commands) == 2
    for command in commands:
        assert "llama-server --model" in command and gemma_model in command
        assert "--metrics" in command
    assert "--port 8080" in commands[0] and "--spec-type" not in commands[0]
    assert "--port 8081 --metrics --spec-type ngram-mod" in commands[1]


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_every_shipped_example_validates(example, gemma_model, llama_server_bin, request):
    if example == "vllm-cpu.yaml":
        request.getfixturevalue("vllm_model")  # its model is the provisioned HF copy
    if example in ("pair.yaml", "ollama.yaml"):
        request.getfixturevalue("model_pair")  # the files `specfleet setup --pair` writes
    path = f"examples/{example}"
    if example == "modelkit.yaml":  # its ModelKit, pushed to a real registry on loopback
        path = str(example_modelkit(request))
    out = specfleet("check", path)
    assert out.returncode == 0, out.stderr
    if example == "modelkit.yaml":  # resolved, and nothing written: check only reads
        assert "modelkit 127.0.0.1:" in out.stdout and "draft: models/draft.gguf" in out.stdout
        assert not (Path(path).parent / "state").exists()


def example_modelkit(request) -> Path:
    """examples/modelkit.yaml with its reference on a local registry holding such a kit,
    and its state dir in the test's directory."""
    registry, tmp = request.getfixturevalue("oci_registry"), request.getfixturevalue("tmp_path")
    doc = yaml.safe_load((REPO / "examples" / "modelkit.yaml").read_text())
    kit = doc["targets"]["qwen3"]["modelkit"]
    repo_tag = kit["ref"].split("/", 1)[1]
    repo, tag = repo_tag.rsplit(":", 1)
    registry.push_modelkit(repo, tag, ("models/target.gguf", b"GGUF" + bytes(64)),
                           [(kit["draft"], "models/draft.gguf", b"GGUF" + bytes(8))],
                           {"name": "qwen3-pair", "version": "1.0"})
    kit["ref"] = f"{registry.host}/{repo_tag}"
    doc["daemon"]["state_dir"] = str(tmp / "state")
    path = tmp / "modelkit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_status_without_a_daemon_says_so(tmp_path: Path):
    out = specfleet("status", "--state-dir", str(tmp_path))
    assert out.returncode == 1
    assert "no specfleet daemon has run" in out.stderr


def test_a_missing_fleet_file_is_a_clear_error(tmp_path: Path):
    out = specfleet("check", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2
    assert "cannot read the file" in out.stderr and "Traceback" not in out.stderr
