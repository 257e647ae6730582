"""Bad fleet files: exit 2, file:line:column, the dotted path, the bad value, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.config.loader import load_fleet
from tests.conftest import REPO
from tests.ggufs import write_model

GOOD_TARGET = "    model: {model}\n    binary: {binary}\n"

# (id, file text, expected line, expected dotted path or None, words the message must contain)
CASES: list[tuple[str, str | bytes, int, str | None, list[str]]] = [
    ("empty file", "", 1, None, ["empty", "version: 1"]),
    ("only comments", "# nothing here\n", 1, None, ["empty"]),
    ("list at top level", "- a\n- b\n", 1, "(top level)", ["list"]),
    ("scalar at top level", "hello\n", 1, "(top level)", ["'hello'"]),
    ("binary garbage", b"\x00\xff\xfe\x89PNG\r\n\x1a\n\x00\x00garbage", 1, None, ["UTF-8"]),
    ("control characters", "version: 1\ntargets:\x07\n", 2, None, ["invalid YAML"]),
    ("tab indentation", "version: 1\ntargets:\n\ta:\n\t\tport: 1\n", 3, None, ["tabs"]),
    ("unclosed bracket", "version: 1\ntargets: {{a: [1, 2\n", 2, None,
     ["invalid YAML", "'[' opened here is not closed", "at line 3"]),
    ("mapping values in a scalar", "version: 1\ndaemon: a: b\n", 2, None, ["invalid YAML"]),
    ("duplicate key", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n  a:\n{t}    port: 8002\n",
     7, "targets.a", ["duplicate key 'a'"]),
    ("missing version", "targets:\n  a:\n{t}    port: 8001\n", 1, "(top level)",
     ["required key 'version'"]),
    ("unsupported version", "version: 2\ntargets: {{}}\n", 1, "version", ["2", "expected one of: 1"]),
    ("misspelled top-level key", "version: 1\ntarget:\n  a:\n{t}    port: 8001\n", 2, "target",
     ["unknown key 'target'", "did you mean 'targets'"]),
    ("misspelled target key", "version: 1\ntargets:\n  a:\n{t}    prot: 8001\n", 6,
     "targets.a.prot", ["did you mean 'port'"]),
    ("misspelled speculation key",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      method: ngram\n"
     "      lenght: {{start: 4}}\n", 9, "targets.a.speculation.lenght", ["did you mean 'length'"]),
    ("bad method", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation: {{method: medusa}}\n",
     7, "targets.a.speculation.method", ["'medusa'", "eagle3", "suffix"]),
    ("bad ngram variant",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation: {{method: ngram, variant: mods}}\n",
     7, "targets.a.speculation.variant", ["'mods'", "did you mean 'mod'", "map-k4v"]),
    ("port is text", "version: 1\ntargets:\n  a:\n{t}    port: eighty\n", 6, "targets.a.port",
     ["whole number", "'eighty'"]),
    ("port out of range", "version: 1\ntargets:\n  a:\n{t}    port: 70000\n", 6, "targets.a.port",
     ["65535", "70000"]),
    ("port zero", "version: 1\ntargets:\n  a:\n{t}    port: 0\n", 6, "targets.a.port", ["1", "0"]),
    ("crash limit of wrong type",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    restart: {{max_crashes: many}}\n", 7,
     "targets.a.restart.max_crashes", ["'many'"]),
    ("bad duration", "version: 1\ndefaults:\n  restart:\n    window: 10 minutes\ntargets:\n  a:\n{t}"
     "    port: 8001\n", 4, "defaults.restart.window", ["'10 minutes'", "5m"]),
    ("bad gpus", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    gpus: first\n", 7,
     "targets.a.gpus", ["'first'", "'all'"]),
    ("duplicate ports", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n  b:\n{t}    port: 8001\n", 10,
     "targets.b.port", ["8001", "targets.a.port"]),
    ("draft with method none",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      draft: {model}\n", 8,
     "targets.a.speculation.draft", ["method is none"]),
    ("draft method without a draft file",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation: {{method: draft}}\n", 7,
     "targets.a.speculation.method", ["needs a draft file"]),
    ("min above max",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      method: ngram\n"
     "      length: {{min: 9, max: 3}}\n", 9, "targets.a.speculation.length.min", ["9", "3"]),
    ("start above max",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      method: ngram\n"
     "      length:\n        start: 40\n        max: 32\n", 10,
     "targets.a.speculation.length.start", ["40", "32"]),
    ("missing model file", "version: 1\ntargets:\n  a:\n    model: /nowhere/m.gguf\n"
     "    binary: {binary}\n    port: 8001\n", 4, "targets.a.model", ["/nowhere/m.gguf", "does not exist"]),
    ("truncated model file", "version: 1\ntargets:\n  a:\n    model: {cut}\n"
     "    binary: {binary}\n    port: 8001\n", 4, "targets.a.model",
     ["cut.gguf is truncated", "did not finish"]),
    ("missing draft file",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      method: draft\n"
     "      draft: /nowhere/d.gguf\n", 9, "targets.a.speculation.draft", ["/nowhere/d.gguf"]),
    ("modelkit without a registry host",
     "version: 1\ntargets:\n  a:\n    port: 8001\n    modelkit: ns/model:v1\n", 5,
     "targets.a.modelkit.ref", ["'ns/model:v1'", "names no registry host", "HOST[:PORT]"]),
    ("modelkit with a bad digest",
     "version: 1\ntargets:\n  a:\n    port: 8001\n    modelkit: {{ref: 'r.example/m@sha256:12'}}\n",
     5, "targets.a.modelkit.ref", ["'sha256:12'", "64 lowercase hex digits"]),
    ("model and modelkit both",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    modelkit: r.example/m:v1\n", 7,
     "targets.a.modelkit", ["both model and modelkit"]),
    ("neither model nor modelkit", "version: 1\ntargets:\n  a:\n    port: 8001\n", 3,
     "targets.a.model", ["no model", "modelkit: HOST/REPOSITORY:TAG"]),
    ("a modelkit draft part the method does not use",
     "version: 1\ntargets:\n  a:\n    port: 8001\n    modelkit: {{ref: r.example/m:v1, draft: d}}\n"
     "    speculation: {{method: ngram}}\n", 5, "targets.a.modelkit.draft",
     ["method ngram takes no draft file"]),
    ("modelkit on a backend that cannot serve one",
     "version: 1\ntargets:\n  a:\n    backend: vllm\n    port: 8001\n    modelkit: r.example/m:v1\n",
     6, "targets.a.modelkit", ["vllm backend cannot serve a model from a ModelKit"]),
    ("bad target name", "version: 1\ntargets:\n  my model!:\n{t}    port: 8001\n", 3,
     "targets.my model!", ["'my model!'", "letters"]),
    ("api key with two sources",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    api_key: {{env: K, file: /k}}\n", 7,
     "targets.a.api_key", ["exactly one"]),
    ("unknown backend", "version: 1\ntargets:\n  a:\n    backend: llamcpp\n{t}    port: 8001\n", 4,
     "targets.a.backend", ["'llamcpp'", "did you mean 'llamacpp'"]),
    ("unset environment variable",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env: {{HF_HOME: '${{SPECFLEET_NOT_SET_X}}'}}\n", 7,
     "targets.a.env.HF_HOME", ["SPECFLEET_NOT_SET_X", "not set"]),
    ("flag owned by specfleet",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    args: [--ctx-size, 2048, --port, 9]\n", 7,
     "targets.a.args[2]", ["--port", "port:"]),
    ("removed llama.cpp flag",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    args: [--draft-max, 8]\n", 7,
     "targets.a.args[0]", ["--draft-max", "removed"]),
    ("targets is a list", "version: 1\ntargets:\n  - model: x\n", 2, "targets", ["mapping"]),
    ("api without port", "version: 1\ndaemon: {{api: localhost}}\ntargets: {{}}\n", 2, "daemon.api",
     ["HOST:PORT", "'localhost'"]),
    ("jitter out of range",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    restart: {{jitter: 1.5}}\n", 7,
     "targets.a.restart.jitter", ["1.5"]),
    ("mapping used as a key",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env:\n      ? {{A: 1}}\n      : x\n", 8,
     "targets.a.env.{...}", ["a mapping is used as a key"]),
    ("list used as a key", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env: {{[A]: 1}}\n",
     7, "targets.a.env.[...]", ["a list is used as a key"]),
    ("python tag on a list",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    args: !!python/object/apply:os.system [id]\n",
     7, "targets.a.args", ["unsupported YAML tag !!python/object/apply:os.system"]),
    ("python tag on a value",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    host: !!python/str 127.0.0.1\n", 7,
     "targets.a.host", ["unsupported YAML tag !!python/str"]),
    ("custom tag", "version: 1\ntargets:\n  a:\n{t}    port: !port 8001\n", 6, "targets.a.port",
     ["unsupported YAML tag !port"]),
    ("NUL in an environment value",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env: {{A: \"x\\0y\"}}\n", 7,
     "targets.a.env.A", ["NUL character"]),
    ("NUL in an environment name",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env: {{\"A\\0B\": x}}\n", 7,
     "targets.a.env.A\\0B", ["NUL character"]),
    ("impossible date", "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    host: 2001-13-01\n", 7,
     "targets.a.host", ["'2001-13-01'", "month must be in 1..12"]),
    ("port is true", "version: 1\ntargets:\n  a:\n{t}    port: true\n", 6, "targets.a.port",
     ["expected a whole number, got true"]),
    ("a number where true or false is expected",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    tuning: {{enabled: 1}}\n", 7,
     "targets.a.tuning.enabled", ["expected true or false, got 1"]),
    ("version is text", "version: \"1\"\ntargets: {{}}\n", 1, "version",
     ["expected the number 1, got the string '1'"]),
    ("equals sign in an environment name",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    env: {{\"A=B\": x}}\n", 7,
     "targets.a.env.A=B", ["not a valid environment variable name", "'='"]),
    ("model is a directory", "version: 1\ntargets:\n  a:\n    model: {dir}\n"
     "    binary: {binary}\n    port: 8001\n", 4, "targets.a.model",
     ["is a directory, expected a GGUF file"]),
    ("draft is a directory",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    speculation:\n      method: draft\n"
     "      draft: {dir}\n", 9, "targets.a.speculation.draft",
     ["is a directory, expected a GGUF file"]),
    ("model path too long to open", "version: 1\ntargets:\n  a:\n    model: /" + "m" * 5000 +
     ".gguf\n    binary: {binary}\n    port: 8001\n", 4, "targets.a.model",
     ["cannot be read", "too long"]),
    ("API token from an unset variable",
     "version: 1\ndaemon:\n  api_token: {{env: SPECFLEET_NOT_SET_TOKEN}}\ntargets:\n  a:\n{t}"
     "    port: 8001\n", 3, "daemon.api_token.env",
     ["SPECFLEET_NOT_SET_TOKEN is not set", "`specfleet run` refuses"]),
    ("API token file that does not exist",
     "version: 1\ndaemon:\n  api_token:\n    file: /nowhere/token\ntargets:\n  a:\n{t}"
     "    port: 8001\n", 4, "daemon.api_token.file",
     ["cannot read '/nowhere/token'", "No such file", "`specfleet run` refuses"]),
    ("name inside a target", "version: 1\ntargets:\n  a:\n    name: b\n{t}    port: 8001\n", 4,
     "targets.a.name", ["its key"]),
    ("container without an image",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    launcher: container\n", 3,
     "targets.a.container.image", ["needs the image"]),
    ("container engine misspelled",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    launcher: container\n"
     "    container: {{image: x, engine: podmna}}\n", 8, "targets.a.container.engine",
     ["'podmna'", "did you mean 'podman'"]),
    ("container ulimit malformed",
     "version: 1\ntargets:\n  a:\n{t}    port: 8001\n    launcher: container\n"
     "    container:\n      image: x\n      ulimits: [nofile 4096]\n", 10,
     "targets.a.container.ulimits", ["'nofile 4096'", "nofile=4096:4096"]),
    ("ollama in a container",
     "version: 1\ntargets:\n  a:\n    backend: ollama\n    model: {model}\n    port: 8001\n"
     "    launcher: container\n    container: {{image: ollama/ollama}}\n", 3, "targets.a",
     ["launcher: external"]),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("fleetfiles")
    model = d / "model.gguf"
    model.write_bytes(b"GGUF")
    binary = d / "llama-server"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    cut = write_model(d / "cut.gguf")
    cut.write_bytes(cut.read_bytes()[:-100])  # a download that did not finish
    return {"model": str(model), "binary": str(binary), "dir": str(d), "cut": str(cut)}


def test_there_are_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize(("text", "line", "path", "words"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_fleet_file_exits_2_with_line_path_and_value(files, text, line, path, words):
    fleet = Path(files["dir"]) / "fleet.yaml"
    if isinstance(text, bytes):
        fleet.write_bytes(text)
    else:
        t = GOOD_TARGET.format(**files)
        fleet.write_text(text.replace("{t}", t.replace("{", "{{").replace("}", "}}"))
                         .format(**files) if "{t}" in text else text.format(**files))
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    problems = proc.stderr.splitlines()[:-1]
    here = [p for p in problems if p.startswith(f"{fleet}:{line}:")]
    assert here, f"no problem reported at line {line}:\n{proc.stderr}"
    if path is not None:
        assert any(f": {path}:" in p or f": {path} " in p for p in here), proc.stderr
    for word in words:
        assert word in proc.stderr, f"{word!r} not in:\n{proc.stderr}"
    assert proc.stderr.rstrip().endswith("nothing was started or changed")


def test_every_problem_is_reported_at_once_sorted_by_line(files, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"version: 1\ntargets:\n  a:\n    model: {files['model']}\n    prot: 1\n"
                     "  b:\n    model: /x.gguf\n    port: 99999\n    speculation: {method: nope}\n")
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    lines = proc.stderr.splitlines()[:-1]
    assert len(lines) == 4, proc.stderr
    assert [int(ln.split(":")[1]) for ln in lines] == sorted(int(ln.split(":")[1]) for ln in lines)


def test_a_bad_value_under_defaults_is_reported_once_not_once_per_target(files, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    t = GOOD_TARGET.format(**files)
    fleet.write_text(f"version: 1\ndefaults:\n  restart: {{max_crashes: 0}}\ntargets:\n"
                     f"  a:\n{t}    port: 8001\n  b:\n{t}    port: 8002\n")
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2
    problems = proc.stderr.splitlines()[:-1]
    assert len(problems) == 1 and "defaults.restart.max_crashes" in problems[0], proc.stderr


def test_version_as_text_is_not_answered_with_did_you_mean_the_same_text(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text('version: "1"\ntargets: {}\n')
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2
    assert "did you mean" not in proc.stderr, proc.stderr


def test_a_port_written_as_text_or_from_the_environment_is_a_number(files, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    t = GOOD_TARGET.format(**files)
    fleet.write_text(f"version: 1\ntargets:\n  a:\n{t}    port: '8001'\n"
                     f"  b:\n{t}    port: ${{PORT}}\n")
    loaded = load_fleet(fleet, environ={"PORT": "8002"})
    assert [t.port for t in loaded.fleet.targets.values()] == [8001, 8002]


def test_an_api_token_file_that_exists_is_enough_for_check_since_it_is_read_per_request(
        files, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    fleet = tmp_path / "fleet.yaml"
    t = GOOD_TARGET.format(**files)
    fleet.write_text(f"version: 1\ndaemon:\n  api_token: {{file: {token}}}\n"
                     f"  state_dir: {tmp_path / 'state'}\ntargets:\n  a:\n{t}    port: 8001\n")
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
