"""The container engine's command lines (launcher/container/command.py) and the Quadlet
unit: pure, every flag checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.launcher.container import command as c
from supervisor.plugin.backend import LaunchSpec

LIMITS = ("nofile=4096:4096", "nproc=4096:4096")
SPEC = LaunchSpec(("/usr/local/bin/llama-server", "--model", "/models/m.gguf", "--port", "8081"),
                  env={"LLAMA_API_KEY": "s3cret", "CUDA_VISIBLE_DEVICES": "0"},
                  secret_env=frozenset({"LLAMA_API_KEY"}))


def test_names_are_what_an_engine_accepts():
    assert c.container_name("gemma-ngram") == "specfleet-gemma-ngram"
    assert c.container_name("Qwen3 Coder/30B") == "specfleet-qwen3-coder-30b"
    assert c.container_name("...") == "specfleet-target"


def test_a_daemons_containers_carry_its_state_dirs_mark_so_two_daemons_never_share_one():
    a, b = (c.container_name("same", owner) for owner in ("/srv/a/state", "/srv/b/state"))
    assert a != b and a.startswith("specfleet-same-") and b.startswith("specfleet-same-")
    assert a == c.container_name("same", "/srv/a/state")  # stable: the next daemon adopts it
    assert len(a) == len("specfleet-same-") + 8


def test_podman_run_is_named_labelled_mounted_on_the_host_network_and_keeps_secrets_off_argv():
    run = c.ContainerRun("podman", "localhost/llama-server:b11434", mounts=("/models/m.gguf",),
                         port=8081, gpus=(0, 1), runtime="runc", env_file="/run/sf/t.env",
                         ulimits=LIMITS, owner="/var/lib/specfleet")
    argv = c.run_argv("gemma", SPEC, run)
    assert argv[:5] == ["podman", "run", "-d", "--name",
                        c.container_name("gemma", "/var/lib/specfleet")]
    assert f"{c.LABEL_TARGET}=gemma" in argv and f"{c.LABEL_SPEC}={c.spec_hash(SPEC, run)}" in argv
    assert f"{c.LABEL_DAEMON}=/var/lib/specfleet" in argv
    assert argv[argv.index("--runtime") + 1] == "runc"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"] == list(LIMITS)
    assert argv[argv.index("--network") + 1] == "host" and "-p" not in argv
    assert argv[argv.index("-v") + 1] == "/models/m.gguf:/models/m.gguf:ro"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--device"] == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert argv[argv.index("--env-file") + 1] == "/run/sf/t.env"
    # The runtime's command is the entry point: an image's own ENTRYPOINT is not prepended.
    assert argv[argv.index("--entrypoint") + 1:] == [
        "/usr/local/bin/llama-server", "localhost/llama-server:b11434", *SPEC.argv[1:]]
    assert not any("s3cret" in a for a in argv)


def test_a_preflight_command_runs_once_in_the_image_with_the_same_runtime_and_limits():
    run = c.ContainerRun("podman", "img:1", runtime="runc", ulimits=LIMITS,
                         mounts=("/models/m.gguf",), gpus=(0,))
    assert c.once_argv(["llama-server", "--help"], run) == [
        "podman", "run", "--rm", "--runtime", "runc", "--ulimit", LIMITS[0], "--ulimit",
        LIMITS[1], "--network", "host", "--entrypoint", "llama-server", "img:1", "--help"]


def test_gpus_are_passed_by_host_index_and_renumbered_inside():
    assert c.gpu_request(None, {"CUDA_VISIBLE_DEVICES": "2,3", "A": "1"}) == (
        (2, 3), {"CUDA_VISIBLE_DEVICES": "0,1", "A": "1"})
    assert c.gpu_request("none", {"CUDA_VISIBLE_DEVICES": ""}) == ((), {"CUDA_VISIBLE_DEVICES": ""})
    assert c.gpu_request("all", {}) == ("all", {})
    assert c.gpu_request(None, {}) == ((), {})
    assert c.gpu_request(None, {"CUDA_VISIBLE_DEVICES": "GPU-8a1b"})[0] == "all"
    podman = c.run_argv("t", SPEC, c.ContainerRun("podman", "img", gpus="all"))
    docker = c.run_argv("t", SPEC, c.ContainerRun("docker", "img", gpus="all"))
    assert podman[podman.index("--device") + 1] == "nvidia.com/gpu=all"
    assert docker[docker.index("--gpus") + 1] == "all"


def test_mounts_are_the_model_files_the_paths_in_the_arguments_and_the_volumes(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{{ x }}")
    spec = LaunchSpec((str(template), "--model", str(template), f"--chat-template-file={template}",
                       "--port", "8081", "--alias", "/not/a/file"))
    mounts = c.mounts_for(spec, ["/models/m.gguf"], ["/srv/lora/", str(template)])
    assert mounts == ("/models/m.gguf", str(template), "/srv/lora")


def test_docker_publishes_the_port_and_passes_gpus_its_own_way():
    run = c.ContainerRun("docker", "img", port=8081, host="127.0.0.1", host_network=False,
                         gpus=(2,), ulimits=())
    argv = c.run_argv("t", SPEC, run)
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8081:8081" and "--network" not in argv
    assert argv[argv.index("--gpus") + 1] == "device=2" and "--ulimit" not in argv
    two = c.run_argv("t", SPEC, c.ContainerRun("docker", "img", gpus=(0, 2)))
    assert two[two.index("--gpus") + 1] == '"device=0,2"'  # docker splits the value at commas


def test_the_spec_hash_changes_with_what_runs_and_not_with_the_order_of_the_environment():
    run = c.ContainerRun("podman", "img:1")
    same = LaunchSpec(SPEC.argv, env=dict(reversed(list(SPEC.env.items()))))
    assert c.spec_hash(SPEC, run) == c.spec_hash(same, run)
    assert c.spec_hash(SPEC, run) != c.spec_hash(SPEC, c.ContainerRun("podman", "img:2"))
    other = LaunchSpec(SPEC.argv, env={**SPEC.env, "LLAMA_API_KEY": "rotated"})
    assert c.spec_hash(SPEC, run) != c.spec_hash(other, run)


def test_the_env_file_holds_every_variable_and_refuses_a_newline():
    assert c.env_file_text(SPEC.env) == "CUDA_VISIBLE_DEVICES=0\nLLAMA_API_KEY=s3cret\n"
    with pytest.raises(ValueError, match="newline"):
        c.env_file_text({"A": "1\n2"})


def test_the_end_of_a_container_reads_as_subprocess_would():
    # As `podman inspect` showed here after kill -9 of the server: exited 137.
    assert c.exit_from_state({"Status": "exited", "Running": False, "ExitCode": 137,
                              "OOMKilled": False}) == c.Exited(False, -9, False)
    assert c.exit_from_state({"Status": "exited", "ExitCode": 1}) == c.Exited(False, 1, False)
    assert c.exit_from_state({"Status": "exited", "ExitCode": 137, "OOMKilled": True}).oom_killed
    assert c.exit_from_state({"Status": "running", "Running": True}).running


def test_a_quadlet_unit_runs_the_same_container_and_old_podman_is_told_why_not():
    from supervisor.launcher.container import quadlet
    assert quadlet.quadlet_support("podman version 4.3.1") == (
        False, "podman 4.3 has no Quadlet (it came in 4.4); run the target with launcher: "
        "container under the daemon instead")
    assert quadlet.quadlet_support("podman version 5.2.0")[0]
    assert not quadlet.quadlet_support("garbage")[0]
    run = c.ContainerRun("podman", "localhost/llama-server:b11434", mounts=("/models/m.gguf",),
                         gpus=(0,), runtime="runc", env_file="/etc/specfleet/gemma.env",
                         ulimits=LIMITS)
    unit = quadlet.render("gemma", SPEC, run, stop_grace=15, env_file=run.env_file)
    assert "ContainerName=specfleet-gemma\n" in unit
    assert "Image=localhost/llama-server:b11434\n" in unit
    assert f"Label={c.LABEL_SPEC}={c.spec_hash(SPEC, run)}\n" in unit
    assert "Exec=--model /models/m.gguf --port 8081\n" in unit
    assert "Network=host\n" in unit and "Volume=/models/m.gguf:/models/m.gguf:ro\n" in unit
    assert "AddDevice=nvidia.com/gpu=0\n" in unit
    assert ("PodmanArgs=--entrypoint=/usr/local/bin/llama-server --runtime=runc "
            "--ulimit=nofile=4096:4096 --ulimit=nproc=4096:4096\n") in unit
    assert "s3cret" not in unit and "TimeoutStopSec=15s" in unit


def check_container_fleet(tmp_path: Path, path_env: str) -> tuple[str, str]:
    """`specfleet check` of a one-target container fleet with PATH as given: the target's
    "run as:" line and the whole output."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"""version: 1
daemon: {{state_dir: {tmp_path / 'state'}}}
targets:
  coder:
    model: {model}
    port: 8081
    gpus: [1]
    launcher: container
    api_key: {{env: SPECFLEET_TEST_KEY}}
    container: {{image: localhost/llama:1, engine: podman}}
""")
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)], cwd=REPO,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "SPECFLEET_TEST_KEY": "s3cret", "PATH": path_env})
    assert proc.returncode == 0, proc.stderr
    return next(ln for ln in proc.stdout.splitlines() if ln.startswith("  run as: ")), proc.stdout


def test_check_prints_the_engines_command_line_without_the_secrets(tmp_path):
    import os
    import shutil

    if shutil.which("podman") is None:
        pytest.skip("podman not installed (scripts/setup.sh installs it: apt-get install podman)")
    line, output = check_container_fleet(tmp_path, os.environ["PATH"])
    model = tmp_path / "m.gguf"
    name = c.container_name("coder", str(tmp_path / "state"))
    assert line.startswith(f"  run as: podman run -d --name {name} "), line
    assert f"-v {model}:{model}:ro" in line and "--device nvidia.com/gpu=1" in line
    assert f"--env-file {tmp_path / 'state'}/containers-env/coder.env" in line
    assert "--entrypoint llama-server localhost/llama:1 --model" in line
    assert "s3cret" not in output


def test_check_says_the_asked_engine_is_missing_and_looks_for_no_other(tmp_path):
    # PATH is an empty directory: no podman, and no docker to fall back on either.
    line, output = check_container_fleet(tmp_path, str(tmp_path))
    assert line.startswith("  run as: (no container command: "), line
    # engine: podman was asked for by name, so only podman is looked for and named missing
    # (engine: auto would look for "podman or docker").
    assert "container engine podman was not found on PATH" in line, line
    assert "podman or docker was not found" not in line, line
    assert "s3cret" not in output


def test_the_run_record_names_the_image_by_reference_id_and_digest():
    from supervisor.launcher.container.engine import image_facts
    # podman's `image inspect` of an imported image: a Digest, no RepoDigests.
    assert image_facts("localhost/l:1", {"Id": "abc", "Digest": "sha256:d1", "RepoDigests": []}
                       ) == {"image": "localhost/l:1", "image_id": "abc", "image_digest": "sha256:d1"}
    # docker's: no Digest, the registry's digest in RepoDigests.
    assert image_facts("ghcr.io/x:server", {"Id": "sha256:i", "RepoDigests": [
        "ghcr.io/x@sha256:d2"]})["image_digest"] == "sha256:d2"


async def test_a_command_missing_from_the_image_is_refused_with_the_engines_words():
    from supervisor.errors import SpecfleetError
    from supervisor.plugin.executor import Executor

    said = "Error: executable file `llama-servr` not found in $PATH"
    missing = Executor(wrap=lambda argv: ["sh", "-c", f"echo '{said}'; exit 127"],
                       identity="sha256:1", facts={"image": "localhost/l:1"})
    with pytest.raises(SpecfleetError, match="llama-servr cannot run in localhost/l:1 "
                       r"\(exit status 127\): Error: executable file"):
        await missing.output(["llama-servr", "--help"])
    fine = Executor(wrap=lambda argv: ["sh", "-c", "echo usage; exit 1"], identity="sha256:1")
    assert await fine.output(["llama-server", "--help"]) == "usage\n"
