"""Hostile YAML is a fleet-file error like any other: exit 2 from `check` with file:line and
the limit that was hit, within bounded time and memory (the CLI runs under a 1 GiB address
space limit and a 20 s timeout), and FleetFileError from load_fleet, never a traceback."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from supervisor.config import loader
from supervisor.config.loader import load_fleet
from supervisor.config.yamlsource import (
    MAX_ALIAS_VALUES,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NUMBER_CHARS,
    MAX_SCALAR_CHARS,
    MAX_VALUES,
)
from supervisor.errors import FleetFileError
from tests.conftest import REPO, llama_target, write_fleet

MEMORY_LIMIT = 1 << 30
TIME_LIMIT = 20
HEAD = "version: 1\ntargets:\n  a:\n    model: /nowhere/m.gguf\n    port: 8001\n"


def _billion_laughs() -> str:
    lines = ["version: 1", "targets: {}", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


def _merge_bomb() -> str:
    lines = ["version: 1", "targets: {}", "m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], k{i}: {i}}}"
              for i in range(1, 10)]
    return "\n".join(lines) + "\n"


# (id, file text, expected line or None for the whole file, words the message must contain)
CASES: list[tuple[str, str, int | None, list[str]]] = [
    ("recursive alias", HEAD + "    args: &r [a, *r]\n", 6,
     ["targets.a.args[1]", "recursive alias", "*r"]),
    ("recursive alias through a mapping", HEAD + "    options: &o {x: *o}\n", 6,
     ["recursive alias", "*o"]),
    ("nesting 500 levels deep in flow style", HEAD + "    options: {x: " + "[" * 500 + "]" * 500
     + "}\n", 6, [f"more than {MAX_DEPTH} levels"]),
    ("nesting 300 levels deep in block style", HEAD + "    options:\n" + "".join(
        "  " * (i + 3) + f"k{i}:\n" for i in range(300)), None, [f"more than {MAX_DEPTH} levels"]),
    ("an integer of 5000 digits", HEAD.replace("8001", "9" * 5000), 5,
     ["targets.a.port", "5000 characters", f"at most {MAX_NUMBER_CHARS}"]),
    ("a float of 5000 digits", HEAD + "    restart: {jitter: 0." + "1" * 5000 + "}\n", 6,
     ["5002 characters"]),
    ("billion laughs", _billion_laughs(), None, [f"more than {MAX_ALIAS_VALUES} values", "*l"]),
    ("billion laughs through merge keys", _merge_bomb(), None,
     [f"more than {MAX_ALIAS_VALUES} values"]),
    ("aliases of a long text", "version: 1\ntargets: {}\ns: &s '" + "x" * 60000 + "'\nl: ["
     + ", ".join(["*s"] * 100) + "]\n", 4, ["aliases expand to more than", "characters"]),
    ("a 20 MB file", "version: 1\ntargets: {}\n" + "# padding padding padding\n" * 800_000,
     None, [f"larger than {MAX_FILE_BYTES // 1024} KiB"]),
    ("one value of 200000 characters", HEAD + "    args: [" + "x" * 200_000 + "]\n", 6,
     ["200000 characters", f"at most {MAX_SCALAR_CHARS}"]),
    ("too many values", "version: 1\ntargets: {}\nx: [" + ",".join(["1"] * (MAX_VALUES + 10))
     + "]\n", 3, [f"more than {MAX_VALUES} values"]),
]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.parametrize(("text", "line", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_yaml_is_a_fleet_file_error_within_bounded_time_and_memory(
        tmp_path, text, line, words):
    fleet = _write(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, check=False,
                          timeout=TIME_LIMIT, preexec_fn=_limited)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"{fleet}:{line}:" if line else f"{fleet}:"), first
    assert "limit" in first or "recursive alias" in first, first
    for word in words:
        assert word in first, f"{word!r} not in: {first}"
    assert proc.stderr.rstrip().endswith("nothing was started or changed")


@pytest.mark.parametrize("text", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_yaml_raises_fleet_file_error_from_load_fleet(tmp_path, text):
    fleet = _write(tmp_path, text)
    with pytest.raises(FleetFileError) as caught:
        load_fleet(fleet)
    assert str(caught.value).startswith(str(fleet))


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded"),
                                   ValueError("Exceeds the limit (4300 digits)"), MemoryError()],
                         ids=["RecursionError", "ValueError", "MemoryError"])
def test_any_recursion_value_or_memory_error_while_reading_yaml_becomes_a_fleet_file_error(
        tmp_path, monkeypatch, error):
    fleet = _write(tmp_path, HEAD)

    def explode(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(loader, "load_yaml", explode)
    with pytest.raises(FleetFileError) as caught:
        load_fleet(fleet)
    assert str(caught.value).startswith(f"{fleet}: ")


def test_an_ordinary_anchor_and_merge_key_still_load(tmp_path):
    fleet = _write(tmp_path, "version: 1\ndefaults:\n  restart: &r {max_crashes: 3}\n"
                             "targets:\n  a:\n    model: /m.gguf\n    port: 8001\n"
                             "    health: &h {failures: 4}\n"
                             "  b:\n    <<: {model: /m.gguf}\n    port: 8002\n"
                             "    health: *h\n    restart: *r\n")
    fleet_ = load_fleet(fleet).fleet
    assert fleet_.targets["b"].health.failures == 4
    assert fleet_.targets["b"].restart.max_crashes == 3
    assert fleet_.targets["b"].model == "/m.gguf"


def test_a_billion_laughs_reload_is_rejected_quickly_and_the_running_fleet_is_untouched(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"a": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    pid = daemon.wait_state("a", "ready")["pid"]
    api = "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]
    rss_before = psutil.Process(daemon.proc.pid).memory_info().rss
    bomb = _billion_laughs().replace("version: 1\n", "").replace("targets: {}\n", "")
    fleet.write_text(fleet.read_text().split("targets:")[0] + bomb + "targets:\n  a: *l9\n")
    request = urllib.request.Request(f"{api}/v1/reload", method="POST", data=b"")
    # "Quickly" is the request's timeout, a hang guard: a reload still parsing after 10 s
    # raises TimeoutError, not the HTTPError expected here.
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 422
    problems = json.loads(answer.value.read())["problems"]
    assert any(f"more than {MAX_ALIAS_VALUES} values" in p for p in problems), problems
    assert psutil.Process(daemon.proc.pid).memory_info().rss < rss_before + (200 << 20)
    assert daemon.proc.poll() is None
    assert daemon.target("a")["pid"] == pid and daemon.target("a")["state"] == "ready"
