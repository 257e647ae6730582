"""The container engine's command lines (launcher/container/command.py, issue 18's
groundwork): pure, every flag checked."""

from __future__ import annotations

import pytest

from supervisor.launcher.container import command as c
from supervisor.plugin.backend import LaunchSpec

SPEC = LaunchSpec(("/usr/local/bin/llama-server", "--model", "/models/m.gguf", "--port", "8081"),
                  env={"LLAMA_API_KEY": "s3cret", "CUDA_VISIBLE_DEVICES": "0"},
                  secret_env=frozenset({"LLAMA_API_KEY"}))


def test_names_are_what_an_engine_accepts():
    assert c.container_name("gemma-ngram") == "specfleet-gemma-ngram"
    assert c.container_name("Qwen3 Coder/30B") == "specfleet-qwen3-coder-30b"
    assert c.container_name("...") == "specfleet-target"


def test_podman_run_is_named_labelled_mounted_on_the_host_network_and_keeps_secrets_off_argv():
    run = c.ContainerRun("podman", "localhost/llama-server:b11434", mounts=("/models/m.gguf",),
                         port=8081, gpus=(0, 1), runtime="runc", env_file="/run/sf/t.env")
    argv = c.run_argv("gemma", SPEC, run)
    assert argv[:5] == ["podman", "run", "-d", "--name", "specfleet-gemma"]
    assert f"{c.LABEL_TARGET}=gemma" in argv and f"{c.LABEL_SPEC}={c.spec_hash(SPEC, run)}" in argv
    assert argv[argv.index("--runtime") + 1] == "runc"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--ulimit"] == list(c.DEFAULT_ULIMITS)
    assert argv[argv.index("--network") + 1] == "host" and "-p" not in argv
    assert argv[argv.index("-v") + 1] == "/models/m.gguf:/models/m.gguf:ro"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--device"] == [
        "nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert argv[argv.index("--env-file") + 1] == "/run/sf/t.env"
    assert argv[argv.index("localhost/llama-server:b11434") + 1:] == list(SPEC.argv)
    assert not any("s3cret" in a for a in argv)


def test_docker_publishes_the_port_and_passes_gpus_its_own_way():
    run = c.ContainerRun("docker", "img", port=8081, host="127.0.0.1", host_network=False,
                         gpus=(2,), ulimits=())
    argv = c.run_argv("t", SPEC, run)
    assert argv[argv.index("-p") + 1] == "127.0.0.1:8081:8081" and "--network" not in argv
    assert argv[argv.index("--gpus") + 1] == "device=2" and "--ulimit" not in argv


def test_the_spec_hash_changes_with_what_runs_and_not_with_the_order_of_the_environment():
    run = c.ContainerRun("podman", "img:1")
    same = LaunchSpec(SPEC.argv, env=dict(reversed(list(SPEC.env.items()))))
    assert c.spec_hash(SPEC, run) == c.spec_hash(same, run)
    assert c.spec_hash(SPEC, run) != c.spec_hash(SPEC, c.ContainerRun("podman", "img:2"))
    other = LaunchSpec(SPEC.argv, env={**SPEC.env, "LLAMA_API_KEY": "rotated"})
    assert c.spec_hash(SPEC, run) != c.spec_hash(other, run)


def test_the_env_file_holds_every_variable_and_refuses_a_newline():
    assert c.env_file_text(SPEC) == "CUDA_VISIBLE_DEVICES=0\nLLAMA_API_KEY=s3cret\n"
    with pytest.raises(ValueError, match="newline"):
        c.env_file_text(LaunchSpec(("x",), env={"A": "1\n2"}))


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
                         gpus=(0,), runtime="runc", env_file="/etc/specfleet/gemma.env")
    unit = quadlet.render("gemma", SPEC, run, stop_grace=15, env_file=run.env_file)
    assert "ContainerName=specfleet-gemma\n" in unit
    assert "Image=localhost/llama-server:b11434\n" in unit
    assert f"Label={c.LABEL_SPEC}={c.spec_hash(SPEC, run)}\n" in unit
    assert "Exec=/usr/local/bin/llama-server --model /models/m.gguf --port 8081\n" in unit
    assert "Network=host\n" in unit and "Volume=/models/m.gguf:/models/m.gguf:ro\n" in unit
    assert "AddDevice=nvidia.com/gpu=0\n" in unit
    assert "PodmanArgs=--runtime=runc --ulimit=nofile=4096:4096 --ulimit=nproc=4096:4096\n" in unit
    assert "s3cret" not in unit and "TimeoutStopSec=15s" in unit
