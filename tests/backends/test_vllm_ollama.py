"""vLLM and Ollama backends: launch specs checked against hand-verified argv, JSON and
Modelfiles; their wire formats (Prometheus text, JSON bodies, log lines) parsed from
recorded fixtures; and both supervised by the real daemon and process launcher, against
stand-in servers that reproduce those formats over real HTTP (tests/fake_runtimes.py)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from plugins.ollama import OllamaBackend, runner_draft_args
from plugins.vllm import VllmBackend, parse_metrics, speculative_config
from supervisor.config.schema import Target
from supervisor.gpu.vram import Assignment
from supervisor.plugin.backend import FailureKind, MetricsSample
from supervisor.tuning.window import delta_between
from tests.conftest import FAST_HEALTH, FAST_RESTART, REPO, free_port, wait_for, write_fleet

FIXTURES = REPO / "tests" / "fixtures"


def vllm_target(**over) -> Target:
    return Target(**{"name": "coder", "backend": "vllm", "model": "Qwen/Qwen3-8B", "port": 8000,
                     "binary": "/bin/true", **over})


@pytest.mark.parametrize(("speculation", "options", "expected"), [
    ({"method": "draft", "draft": "Qwen/Qwen3-0.6B"}, {},
     {"method": "draft_model", "num_speculative_tokens": 5, "model": "Qwen/Qwen3-0.6B"}),
    ({"method": "draft", "draft": "Qwen/Qwen3-0.6B", "length": {"start": 7}},
     {"draft_tensor_parallel_size": 1},
     {"method": "draft_model", "num_speculative_tokens": 7, "model": "Qwen/Qwen3-0.6B",
      "draft_tensor_parallel_size": 1}),
    ({"method": "eagle", "draft": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}, {},
     {"method": "eagle", "num_speculative_tokens": 3,
      "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}),
    ({"method": "eagle3", "draft": "RedHatAI/Qwen3-8B-speculator.eagle3"}, {},
     {"method": "eagle3", "num_speculative_tokens": 3,
      "model": "RedHatAI/Qwen3-8B-speculator.eagle3"}),
    ({"method": "mtp"}, {}, {"method": "mtp", "num_speculative_tokens": 1}),
    ({"method": "ngram"}, {"prompt_lookup_min": 3, "prompt_lookup_max": 6},
     {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3,
      "prompt_lookup_max": 6}),
    ({"method": "suffix", "length": {"start": 16}}, {},
     {"method": "suffix", "num_speculative_tokens": 16}),
    ({"method": "none"}, {}, None),
])
def test_vllm_speculative_config_for_every_method(speculation, options, expected):
    assert speculative_config(vllm_target(speculation=speculation, options=options), None) \
        == expected


def test_vllm_argv_with_tuned_length_memory_share_and_the_key_in_the_environment(monkeypatch):
    monkeypatch.setenv("QWEN_KEY", "k3y")
    target = vllm_target(speculation={"method": "ngram"}, api_key={"env": "QWEN_KEY"},
                         args=["--max-model-len", "8192"])
    spec = VllmBackend(target).launch_spec(9, placement=Assignment("coder", (1,), {1: 1}, 0.455))
    assert spec.argv == (
        "/bin/true", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8000",
        "--served-model-name", "coder", "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":9,"prompt_lookup_min":2,'
        '"prompt_lookup_max":5}',
        "--gpu-memory-utilization", "0.455", "--max-model-len", "8192")
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "1", "VLLM_API_KEY": "k3y"}
    assert "k3y" not in spec.shell_line() and spec.secret_env == {"VLLM_API_KEY"}
    off = VllmBackend(target).launch_spec(9, speculation=False)
    assert "--speculative-config" not in off.argv


def test_vllm_metrics_are_summed_across_engines_with_per_position_counts():
    sample = parse_metrics((FIXTURES / "vllm_metrics.txt").read_text())
    assert sample == MetricsSample(
        process_start=1.7960123e9, drafts=1700, draft_tokens=5100, accepted_tokens=3300,
        accepted_per_position=(1500, 1070, 730), tokens_predicted=4800,
        tokens_predicted_seconds=48.0, prompt_tokens=9216, requests_processing=3,
        requests_deferred=1)
    assert sample.acceptance_rate == pytest.approx(3300 / 5100)


def test_a_vllm_restart_resets_the_counters_and_the_window_starts_over():
    text = (FIXTURES / "vllm_metrics.txt").read_text()
    before = parse_metrics(text)
    after = parse_metrics(text.replace("1.7960123e+09", "1.7960199e+09").replace(
        "} 1000.0", "} 10.0"))  # a new process: a later start time and small counters again
    delta = delta_between(before, after, 0.0)
    assert delta.drafts == after.drafts == 710  # from zero, not a negative difference


def test_vllm_failure_output_becomes_clear_errors():
    backend = VllmBackend(vllm_target())
    oom = backend.explain_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to "
                                  "allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB", 1)
    assert oom.kind == FailureKind.OUT_OF_MEMORY and oom.retryable
    missing = backend.explain_failure(
        "OSError: Qwen/Qwen9-8B is not a local folder and is not a valid model identifier "
        "listed on 'https://huggingface.co/models'", 1)
    assert missing.kind == FailureKind.LOAD_ERROR and not missing.retryable
    bad = backend.explain_failure(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
        "SpeculativeConfig\nmethod\n  Input should be 'ngram', 'eagle', 'eagle3' or 'mtp'", 1)
    assert bad.kind == FailureKind.BAD_ARGUMENTS and "Input should be 'ngram'" in bad.summary


def ollama_target(tmp_path, **over) -> Target:
    model, draft = tmp_path / "m.gguf", tmp_path / "d.gguf"
    model.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    return Target(**{"name": "chat", "backend": "ollama", "model": str(model), "port": 11500,
                     "binary": "/bin/true",
                     "speculation": {"method": "draft", "draft": str(draft),
                                     "length": {"start": 4}},
                     "options": {"num_ctx": 8192, "modelfile_dir": str(tmp_path),
                                 "parameters": {"temperature": 0.2}}, **over})


def test_ollama_modelfile_and_serve_command(tmp_path):
    target = ollama_target(tmp_path, options={"num_ctx": 8192, "modelfile_dir": str(tmp_path),
                                              "parameters": {"temperature": 0.2},
                                              "models_dir": "/srv/ollama"})
    spec = OllamaBackend(target).launch_spec(6)
    assert spec.argv == ("/bin/true", "serve")
    assert spec.env == {"OLLAMA_HOST": "127.0.0.1:11500", "OLLAMA_KEEP_ALIVE": "-1",
                        "OLLAMA_MODELS": "/srv/ollama"}
    assert spec.files == {str(tmp_path / "chat.Modelfile"): (
        f"FROM {tmp_path}/m.gguf\nDRAFT {tmp_path}/d.gguf\nPARAMETER draft_num_predict 6\n"
        "PARAMETER num_ctx 8192\nPARAMETER temperature 0.2\n")}
    without = OllamaBackend(target).launch_spec(6, speculation=False)
    assert "DRAFT" not in next(iter(without.files.values()))


def test_ollama_checks_a_draft_as_its_source_runs_it(tmp_path):
    """v0.33.0-rc2: parser/parser.go refuses a DRAFT that is the FROM file (symlinks
    resolved); llm/llama_server.go runs any draft whose architecture is not dflash as
    --spec-type draft-mtp with backend sampling, draft_num_predict as --spec-draft-n-max."""
    target = ollama_target(tmp_path)
    same = target.model_copy(update={"speculation": target.speculation.model_copy(
        update={"draft": target.model})})
    link = tmp_path / "link.gguf"
    link.symlink_to(tmp_path / "m.gguf")
    linked = target.model_copy(update={"speculation": target.speculation.model_copy(
        update={"draft": str(link)})})
    for refused in (same, linked):
        (problem,) = [p for p in OllamaBackend.check(refused) if p.severity == "error"]
        assert problem.path == ("speculation", "draft")
        assert "must not reference the same local path as FROM" in problem.message
    (warning,) = [p for p in OllamaBackend.check(target) if p.path == ("speculation", "draft")]
    assert warning.severity == "warning" and "--spec-type draft-mtp" in warning.message
    assert runner_draft_args("gemma3", 4, "/d") == [
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "4", "--spec-draft-backend-sampling",
        "--spec-draft-model", "/d"]
    assert runner_draft_args("dflash", 6, "/d") == [
        "--spec-type", "draft-dflash", "--spec-draft-n-max", "6", "--spec-draft-model", "/d"]
    assert runner_draft_args("gemma3", 0, "/d") == []
    backend = OllamaBackend(target)
    said = backend.describe_launch(backend.launch_spec())
    assert said[-1].startswith("Ollama then runs its llama-server with --spec-type draft-mtp "
                               "--spec-draft-n-max 4")
    length = target.speculation.length.model_copy(update={"start": 0})  # 0: no drafting
    none = OllamaBackend(target.model_copy(update={"speculation": target.speculation.model_copy(
        update={"length": length})}))
    assert none.describe_launch(none.launch_spec())[-1] == (
        "Ollama then runs its llama-server without a draft (draft_num_predict 0)")


def test_ollama_refuses_a_network_bind_unless_a_proxy_guards_it(tmp_path):
    exposed = ollama_target(tmp_path, host="0.0.0.0")
    (problem,) = [p for p in OllamaBackend.check(exposed) if p.severity == "error"]
    assert problem.path == ("host",) and "Ollama has no authentication" in problem.message
    guarded = ollama_target(tmp_path, host="0.0.0.0",
                            options={"proxy_guarded": True, "modelfile_dir": str(tmp_path)})
    assert [p for p in OllamaBackend.check(guarded) if p.severity == "error"] == []


def test_ollama_acceptance_and_throughput_come_from_the_llama_server_log_lines(tmp_path):
    backend = OllamaBackend(ollama_target(tmp_path))
    for line in (FIXTURES / "llama_server_timing.log").read_text().splitlines():
        backend.on_output(line)
    import asyncio

    sample = asyncio.run(backend.read_metrics(None))  # type: ignore[arg-type]
    # 43 accepted at mean len 4.91 -> 11 steps; 40 at 4.33 -> 12 steps
    assert (sample.drafts, sample.draft_tokens, sample.accepted_tokens) == (23, 90, 83)
    assert sample.tokens_predicted == 128
    assert sample.tokens_predicted_seconds == pytest.approx((1777.93 + 1490.52) / 1000)


def test_check_of_the_vllm_and_ollama_examples_prints_the_json_and_the_modelfile(model_pair):
    vllm = subprocess.run([sys.executable, "-m", "supervisor", "check", "examples/vllm.yaml"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert vllm.returncode == 0, vllm.stderr
    assert '"method": "eagle3",\n' in vllm.stdout and "--speculative-config" in vllm.stdout
    assert "cannot be checked offline" in vllm.stderr  # warnings, not errors
    ollama = subprocess.run([sys.executable, "-m", "supervisor", "check", "examples/ollama.yaml"],
                            capture_output=True, text=True, cwd=REPO, check=False)
    assert ollama.returncode == 0, ollama.stderr
    assert "DRAFT " in ollama.stdout and "PARAMETER draft_num_predict 4" in ollama.stdout
    assert "Ollama then runs its llama-server with --spec-type draft-mtp" in ollama.stdout
    assert "as an MTP head" in ollama.stderr  # the warning, from the draft's architecture


# --- supervised by the real daemon, against the stand-ins ---

def runtime(tmp_path: Path, name: str) -> str:
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO}/tests/fake_runtimes.py "
                      f"{name} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_vllm_target_is_supervised_and_its_engines_counters_read(tmp_path, start_daemon):
    fleet = write_fleet(tmp_path, {"coder": {
        "backend": "vllm", "model": "Qwen/Qwen3-8B", "port": free_port(),
        "binary": runtime(tmp_path, "vllm"), "speculation": {"method": "ngram"},
        "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART),
        "tuning": {"enabled": False}}})
    daemon = start_daemon(fleet)
    pid = daemon.wait_state("coder", "ready", 30)["pid"]
    metrics = wait_for(lambda: daemon.target("coder")["metrics"].get("drafts"), 30, "counters")
    assert metrics % 1700 == 0  # the two engines summed, at some scrape
    log = (daemon.state_dir / "logs" / "coder.log").read_text()
    assert 'speculative_config={"method":"ngram","num_speculative_tokens":5' in log
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: (t := daemon.target("coder")).get("state") == "ready" and t["pid"] != pid,
             30, "the restart")


def test_a_vllm_cuda_out_of_memory_is_retried_once_then_failed(tmp_path, start_daemon,
                                                               monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "oom")
    fleet = write_fleet(tmp_path, {"big": {
        "backend": "vllm", "model": "Qwen/Qwen3-235B", "port": free_port(),
        "binary": runtime(tmp_path, "vllm"), "health": dict(FAST_HEALTH),
        "restart": dict(FAST_RESTART)}})
    failed = start_daemon(fleet).wait_state("big", "failed", 30)
    assert failed["restarts"] == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in failed["last_event"]["reason"]


def test_an_ollama_target_is_created_loaded_and_its_log_read(tmp_path, model, model_pair,
                                                            start_daemon):
    port, draft = free_port(), model_pair["partial_draft"]
    fleet = write_fleet(tmp_path, {"chat": {
        "backend": "ollama", "model": model, "port": port, "binary": runtime(tmp_path, "ollama"),
        "speculation": {"method": "draft", "draft": draft, "length": {"start": 4}},
        "options": {"modelfile_dir": str(tmp_path / "modelfiles")},
        "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART),
        "tuning": {"enabled": False}}})
    daemon = start_daemon(fleet)
    daemon.wait_state("chat", "ready", 30)
    modelfile = (tmp_path / "modelfiles" / "chat.Modelfile").read_text()
    assert f"DRAFT {draft}" in modelfile and "PARAMETER draft_num_predict 4" in modelfile
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/ps", timeout=5) as resp:
        assert [m["name"] for m in json.loads(resp.read())["models"]] == ["specfleet-chat:latest"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/generate", method="POST",
                                 data=json.dumps({"model": "specfleet-chat",
                                                  "prompt": "hi"}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert json.loads(resp.read())["eval_count"] == 64
    metrics = wait_for(lambda: daemon.target("chat")["metrics"].get("drafts"), 30,
                       "acceptance from the server's log")
    assert metrics == 23 and daemon.target("chat")["metrics"]["accepted_tokens"] == 83
    # What the stand-in's runner was started with, as the plugin reads Ollama's source too.
    log = Path(daemon.target("chat")["log_file"]).read_text()
    runner = next(ln for ln in log.splitlines() if 'msg="starting llama-server"' in ln)
    flags = runner.split('cmd="', 1)[1].rstrip('"').split()
    spec = flags[flags.index("--spec-type"):]
    assert spec[:-1] == runner_draft_args("gemma3", 4, "")[:-1]  # the draft as a blob path


def test_an_existing_ollama_server_gets_its_model_managed_and_is_left_running(
        tmp_path, model, start_daemon):
    port = free_port()
    binary = runtime(tmp_path, "ollama")
    server = subprocess.Popen([binary, "serve"], env={**os.environ,
                                                      "OLLAMA_HOST": f"127.0.0.1:{port}"})
    try:
        fleet = write_fleet(tmp_path, {"shared": {
            "backend": "ollama", "launcher": "external", "model": model, "port": port,
            "binary": binary, "options": {"modelfile_dir": str(tmp_path / "mf")},
            "health": dict(FAST_HEALTH), "restart": dict(FAST_RESTART)}})
        daemon = start_daemon(fleet)
        ready = daemon.wait_state("shared", "ready", 30)
        assert ready["pid"] is None or ready["pid"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/ps", timeout=5) as resp:
            assert [m["name"] for m in json.loads(resp.read())["models"]] == [
                "specfleet-shared:latest"]
        assert daemon.stop() == 0
        assert server.poll() is None  # not specfleet's server: it keeps running
    finally:
        server.kill()
        server.wait()
