"""Reloads with the real llama-server: a reload brings back a failed target, a rejected
reload is visible until one succeeds, a file that breaks the YAML loader itself is rejected
like any other, and start events say why they started."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import llama_target, wait_for, write_fleet


def api_of(fleet: Path) -> str:
    return "http://" + yaml.safe_load(fleet.read_text())["daemon"]["api"]


def call(url: str, method: str = "GET") -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_reload_retries_a_failed_target_once_its_model_is_fixed(
        tmp_path, model, llama_server_bin, start_daemon):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF this is not a model" * 100)
    fleet = write_fleet(tmp_path, {"t": llama_target(str(path), llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("t", "failed", 60)
    path.unlink()
    path.symlink_to(model)  # fixed outside specfleet; the fleet file is unchanged
    daemon.signal(signal.SIGHUP)
    daemon.wait_state("t", "ready", 90)
    retry = next(e for e in daemon.events("t") if e.get("old") == "failed")
    assert retry["new"] == "starting"
    assert retry["reason"] == f"retrying after a reload of {fleet}"


def test_a_rejected_reload_is_shown_until_a_reload_succeeds_and_start_reasons_are_true(
        tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"a": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    daemon.wait_state("a", "ready")
    good = fleet.read_text()
    fleet.write_text(good.replace("port:", "prot:", 1))
    status, answer = call(f"{api_of(fleet)}/v1/reload", "POST")
    assert status == 422
    _, targets = call(f"{api_of(fleet)}/v1/targets")
    shown = targets["daemon"]["rejected_reload"]
    assert shown["file"] == str(fleet) and shown["problems"] == answer["problems"]
    assert any("prot" in p for p in shown["problems"])
    assert wait_for(lambda: daemon.status()["daemon"].get("rejected_reload"), 10, "status.json")

    doc = yaml.safe_load(good)
    doc["targets"]["b"] = llama_target(model, llama_server_bin)
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert call(f"{api_of(fleet)}/v1/reload", "POST")[0] == 200
    daemon.wait_state("b", "ready")
    assert call(f"{api_of(fleet)}/v1/targets")[1]["daemon"]["rejected_reload"] is None
    start_b = daemon.events("b")[0]
    assert (start_b["old"], start_b["new"]) == ("stopped", "starting")
    assert start_b["reason"] == f"added to {fleet} (reload)"
    assert daemon.events("a")[0]["reason"] == "daemon started"


@pytest.mark.parametrize("hostile", [
    "  a:\n    model: {model}\n    port: 1\n    args: &r [x, *r]\n",  # a recursive alias
    "  a:\n    model: {model}\n    port: 1\n    args: " + "[" * 400 + "]" * 400 + "\n",
    "  a:\n    model: {model}\n    port: " + "9" * 5000 + "\n",  # past int() digit limits
], ids=["recursive-alias", "deep-nesting", "huge-integer"])
def test_a_file_that_breaks_the_yaml_loader_is_a_rejected_reload_not_a_dead_daemon(
        hostile, tmp_path, model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"a": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    pid = daemon.wait_state("a", "ready")["pid"]
    api = api_of(fleet)
    head = fleet.read_text().split("targets:")[0]
    fleet.write_text(head + "targets:\n" + hostile.format(model=model))
    status, answer = call(f"{api}/v1/reload", "POST")
    assert status == 422 and answer["problems"]
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: len([e for e in daemon.events() if "rejected" in e["reason"]]) == 2, 20,
             "the SIGHUP reload to be rejected too")
    assert daemon.proc.poll() is None
    assert daemon.target("a")["pid"] == pid and daemon.target("a")["state"] == "ready"
