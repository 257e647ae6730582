"""`specfleet status FILE` reads state_dir and the API token without the full loader
(cli/daemonkeys.py): it must find what the full loader finds, or step aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.api.token import read_api_token
from supervisor.cli import daemonkeys
from supervisor.config.loader import load_fleet
from tests.conftest import REPO

TARGET = "targets:\n  a: {model: /m.gguf, port: 8001, binary: /bin/true}\n"


def full(path: Path) -> daemonkeys.DaemonKeys:
    fleet = load_fleet(path).fleet
    return daemonkeys.DaemonKeys(Path(fleet.daemon.state_dir).expanduser(),
                                 read_api_token(fleet))


@pytest.mark.parametrize("daemon", [
    "",
    "daemon: {state_dir: /srv/specfleet}\n",
    "daemon: {state_dir: '${SPECFLEET_T_DIR}/x', api_token: {env: SPECFLEET_T_TOKEN}}\n",
    "daemon: {state_dir: '${SPECFLEET_T_UNSET:-~/sf}'}\n",
    "daemon:\n  api_token: {file: '{tokenfile}'}\n",
    "daemon:\n  api_token: {file: /nowhere/token}\n",
    "daemon:\n  api_token: {env: SPECFLEET_T_UNSET}\n",
    "daemon:\n  state_dir: &d /srv/a\n  log_dir: *d\n",
])
def test_the_light_read_finds_what_the_full_loader_finds(tmp_path, monkeypatch, daemon):
    monkeypatch.setenv("SPECFLEET_T_DIR", str(tmp_path))
    monkeypatch.setenv("SPECFLEET_T_TOKEN", "s3cret")
    monkeypatch.delenv("SPECFLEET_T_UNSET", raising=False)
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("version: 1\n" + daemon.replace("{tokenfile}", str(token)) + TARGET)
    assert daemonkeys.read(str(fleet)) == full(fleet)


def test_the_shipped_examples_read_the_same(monkeypatch):
    for example in (REPO / "examples").glob("*.yaml"):
        assert daemonkeys.read(str(example)) == full(example), example


@pytest.mark.parametrize("text", [
    "version: 2\n",
    "- a\n",
    "version: 1\ndaemon: [a]\n",
    "version: 1\ndaemon: {state_dir: 5}\n",
    "version: 1\ndaemon: {state_dir: '${SPECFLEET_T_UNSET}'}\n",
    "version: 1\ndaemon: {api_token: {env: A, file: /b}}\n",
    "version: 1\ndaemon: {api_token: {path: /b}}\n",
    "version: 1\ntargets: {a: [\n",
])
def test_anything_unexpected_is_left_to_the_full_loader(tmp_path, monkeypatch, text):
    monkeypatch.delenv("SPECFLEET_T_UNSET", raising=False)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    assert daemonkeys.read(str(fleet)) is None
    assert daemonkeys.read(str(tmp_path / "missing.yaml")) is None
