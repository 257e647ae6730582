"""llama.cpp plugin: the command for every speculation method, old-build detection, failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from plugins.llamacpp.backend import LlamaCppBackend
from plugins.llamacpp.flags import check_help_text, method_args
from plugins.llamacpp.metrics import parse_metrics
from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.plugin.backend import FailureKind


def target(**over) -> Target:
    return Target(name="t", model="/m/target.gguf", port=8080, **over)


@pytest.mark.parametrize(("speculation", "expected"), [
    ({"method": "none"}, []),
    ({"method": "draft", "draft": "/m/d.gguf", "length": {"start": 16}},
     ["--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf", "--spec-draft-n-max", "16"]),
    ({"method": "draft", "draft": "/m/d.gguf"},
     ["--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf"]),
    ({"method": "eagle3", "draft": "/m/e.gguf", "length": {"start": 6}},
     ["--spec-type", "draft-eagle3", "--spec-draft-model", "/m/e.gguf", "--spec-draft-n-max", "6"]),
    ({"method": "mtp", "length": {"start": 2}},
     ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]),
    ({"method": "mtp", "draft": "/m/mtp.gguf"},
     ["--spec-type", "draft-mtp", "--spec-draft-model", "/m/mtp.gguf"]),
    ({"method": "dflash", "draft": "/m/df.gguf", "length": {"start": 8}},
     ["--spec-type", "draft-dflash", "--spec-draft-model", "/m/df.gguf", "--spec-draft-n-max", "8"]),
    ({"method": "ngram"}, ["--spec-type", "ngram-mod"]),
    ({"method": "ngram", "variant": "mod", "length": {"start": 16}},
     ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16", "--spec-ngram-mod-n-min", "12"]),
    ({"method": "ngram", "variant": "simple", "length": {"start": 24}},
     ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "24"]),
    ({"method": "ngram", "variant": "map-k", "length": {"start": 8}},
     ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-m", "8"]),
    ({"method": "ngram", "variant": "map-k4v", "length": {"start": 8}},
     ["--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-m", "8"]),
    ({"method": "ngram", "variant": "cache", "length": {"start": 8}},
     ["--spec-type", "ngram-cache"]),
])
def test_every_speculation_method_maps_to_the_2026_flags(speculation, expected):
    assert method_args(target(speculation=speculation), None) == expected


def test_a_tuned_draft_length_overrides_the_configured_start():
    t = target(speculation={"method": "draft", "draft": "/d.gguf", "length": {"start": 16}})
    assert method_args(t, 5)[-2:] == ["--spec-draft-n-max", "5"]


def test_launch_spec_always_enables_metrics_and_keeps_the_api_key_out_of_argv(
        tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_KEY_FOR_TEST", "s3cret")
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    t = target(binary=str(binary), api_key={"env": "SECRET_KEY_FOR_TEST"}, gpus=[0, 1],
               args=["--ctx-size", 2048])
    spec = LlamaCppBackend(t).launch_spec()
    assert spec.argv == (str(binary), "--model", "/m/target.gguf", "--host", "127.0.0.1",
                         "--port", "8080", "--metrics", "--ctx-size", "2048")
    assert spec.env["LLAMA_API_KEY"] == "s3cret"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "s3cret" not in spec.shell_line()
    assert "LLAMA_API_KEY=***" in spec.shell_line()


OLD_HELP = """----- common params -----
-m,    --model FNAME                    model path to load
--host HOST                             ip address to listen (default: 127.0.0.1)
--port PORT                             port to listen (default: 8080)
--metrics                               enable prometheus compatible metrics endpoint
----- speculative -----
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding
"""


def test_a_help_text_without_spec_type_is_reported_as_too_old():
    assert check_help_text("... --spec-type TYPE ...") is None
    message = check_help_text(OLD_HELP)
    assert message is not None and "too old" in message and "--spec-type" in message


def fake_binary(tmp_path: Path, help_text: str) -> Path:
    script = tmp_path / "old-llama-server"
    (tmp_path / "help.txt").write_text(help_text)
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 4000 (old)' >&2;"
                      f" else cat {tmp_path / 'help.txt'}; fi\n")
    script.chmod(0o755)
    return script


def test_preflight_refuses_an_old_build_before_starting_it(tmp_path):
    # The binary here stands in for an old llama-server at its CLI boundary: its --help.
    binary = fake_binary(tmp_path, OLD_HELP)
    t = target(binary=str(binary), speculation={"method": "ngram"})
    with pytest.raises(SpecfleetError, match="too old"):
        asyncio.run(LlamaCppBackend(t).preflight())
    # Without speculation the old build is fine.
    info = asyncio.run(LlamaCppBackend(target(binary=str(binary))).preflight())
    assert info.version == "4000 (old)"


def test_preflight_accepts_the_real_build(llama_server_bin):
    t = target(binary=llama_server_bin, speculation={"method": "ngram"})
    info = asyncio.run(LlamaCppBackend(t).preflight())
    assert info.binary == llama_server_bin


@pytest.mark.parametrize(("output", "kind", "retryable"), [
    ("llama_model_load: error loading model: tensor data is not within the file bounds\n"
     "srv    load_model: failed to load model, '/m.gguf'\nsrv    operator(): operator(): "
     "cleaning up before exit...\nmain: exiting due to model loading error",
     FailureKind.LOAD_ERROR, False),
    ("error while handling argument \"--ctx-size\": stoi\n", FailureKind.BAD_ARGUMENTS, False),
    ("error: invalid argument: --bogus\n", FailureKind.BAD_ARGUMENTS, False),
    ("srv    start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n",
     FailureKind.PORT_IN_USE, True),
    # llama.cpp b11434's whole CUDA out-of-memory sequence: it also says "failed to load
    # model", but the cause is memory, and memory can come back (policy.after_failure).
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: "
     "cudaMalloc failed: out of memory\n"
     "alloc_tensor_range: failed to allocate CUDA0 buffer of size 9437184000\n"
     "llama_model_load: error loading model: unable to allocate CUDA0 buffer\n"
     "llama_model_load_from_file_impl: failed to load model\n"
     "srv    load_model: failed to load model, '/m.gguf'\n"
     "main: exiting due to model loading error\n", FailureKind.OUT_OF_MEMORY, True),
    ("llama_init_from_model: failed to initialize the context: failed to allocate buffer for "
     "kv cache\n", FailureKind.OUT_OF_MEMORY, True),
])
def test_runtime_failure_output_becomes_a_clear_error(output, kind, retryable):
    failure = LlamaCppBackend(target()).explain_failure(output, 1)
    assert failure is not None
    assert failure.kind == kind and failure.retryable == retryable


def test_unrecognised_output_is_left_to_the_generic_crash_message():
    assert LlamaCppBackend(target()).explain_failure("Segmentation fault", -11) is None


METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 26
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 40
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0.5
# HELP llamacpp:spec_decode_num_drafts_total Number of drafts.
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 3
# HELP llamacpp:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 28
# HELP llamacpp:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 27
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted per position.
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="10"} 1
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 3
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


def test_metrics_are_parsed_including_acceptance_per_position_in_numeric_order():
    m = parse_metrics(METRICS, 1764468000.0)
    assert (m.drafts, m.draft_tokens, m.accepted_tokens) == (3, 28, 27)
    assert m.accepted_per_position == (3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1)
    assert m.tokens_per_second == pytest.approx(80.0)
    assert m.requests_processing == 1
    assert m.process_start == 1764468000.0


def test_preflight_refuses_a_flag_the_build_does_not_list_before_starting_it(tmp_path):
    """A build older or newer than b11434 may lack a flag specfleet generates: refused at
    start, naming the flag, the build and where it came from, not left to its usage text."""
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "llama-server-b11434-help.txt")
    without_metrics = "\n".join(ln for ln in real.read_text().splitlines()
                                if not ln.startswith("--metrics"))
    (tmp_path / "old").mkdir()
    binary = fake_binary(tmp_path / "old", without_metrics)
    with pytest.raises(SpecfleetError) as refused:
        asyncio.run(LlamaCppBackend(target(binary=str(binary))).preflight())
    said = str(refused.value)
    assert "--metrics: llama-server 4000 (old)" in said and str(binary) in said
    assert "does not list it" in said
    # An extra argument the build lists as removed: refused with the help's replacement.
    # (Another script: a build is known by its binary's hash.)
    (tmp_path / "real").mkdir()
    binary = fake_binary(tmp_path / "real", real.read_text())
    with pytest.raises(SpecfleetError, match=r"--draft-max: .* lists it as removed: use "
                                             r"--spec-draft-n-max or --spec-ngram-mod-n-max"):
        asyncio.run(LlamaCppBackend(target(binary=str(binary),
                                           args=["--draft-max", "8"])).preflight())
    assert asyncio.run(LlamaCppBackend(target(binary=str(binary))).preflight())


def test_check_names_each_flag_the_real_build_does_not_take_with_its_replacement(
        tmp_path, llama_server_bin, model):
    """Tried as a new user would: a typo and a flag b11434's own help lists as removed once
    passed `check` with "OK" and failed at start with the usage text."""
    import subprocess
    import sys

    from tests.conftest import REPO, llama_target, write_fleet

    fleet = write_fleet(tmp_path, {"gemma": llama_target(
        model, llama_server_bin, args=["--ctx-sise", "2048", "--spec-ngram-size-n", "4"])})
    checked = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                             capture_output=True, text=True, cwd=REPO, check=False)
    assert checked.returncode == 2, checked.stdout
    said = checked.stderr
    assert f"{fleet}:" in said and "Traceback" not in said
    assert "targets.gemma.args[0]: --ctx-sise: llama-server " in said
    assert "does not list it (did you mean --ctx-size?)" in said
    assert "targets.gemma.args[2]: --spec-ngram-size-n: llama-server " in said
    assert ("lists it as removed: use the respective --spec-ngram-*-size-n or "
            "--spec-ngram-mod-n-match") in said and llama_server_bin in said
