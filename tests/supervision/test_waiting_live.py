"""One target's missing file never stops the fleet (issue 48): what the host lacks for a target
(a model file not there yet, a truncated copy, a runtime binary that is missing) is refused by
`check` but waited for by `run`: the rest start, that target says what it waits for, its
requests get the reason at once, and it starts by itself once the thing is there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, llama_target, wait_for, write_fleet


def ask(proxy: str, name: str, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": name, "prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://{proxy}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def check(fleet: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "check", str(fleet)],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False)


def truncated_copy(model: str, path: Path) -> None:
    """The first 16 MiB of the model: its whole header (the vocabulary comes first) and a
    part of its tensors, as a download that did not finish leaves it."""
    with open(model, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(16 << 20))


def test_a_fleet_whose_targets_lack_files_or_a_binary_starts_degraded_and_heals_by_itself(
        tmp_path, model, llama_server_bin, start_daemon):
    nas, bin_dir = tmp_path / "nas", tmp_path / "opt" / "bin"
    cut = tmp_path / "cut.gguf"
    truncated_copy(model, cut)
    fleet = write_fleet(tmp_path, {
        "good": llama_target(model, llama_server_bin),
        "mounted": llama_target(str(nas / "models" / "m.gguf"), llama_server_bin),
        "partial": llama_target(str(cut), llama_server_bin),
        "nobinary": llama_target(model, str(bin_dir / "llama-server")),
    })
    checked = check(fleet)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    for words in ("targets.mounted.model", "m.gguf' does not exist", "targets.partial.model",
                  "is truncated", "targets.nobinary.binary", "opt/bin/llama-server' is not"):
        assert words in checked.stderr, checked.stderr
    assert "Traceback" not in checked.stderr

    daemon = start_daemon(fleet)
    good = daemon.wait_state("good", "ready")
    for name, words in (("mounted", "does not exist"), ("partial", "is truncated"),
                        ("nobinary", "opt/bin/llama-server' is not an executable file")):
        waiting = daemon.wait_state(name, "waiting", 30)
        reason = waiting["last_event"]["reason"]
        assert words in reason and "the rest of the fleet is not affected" in reason, reason
    notice = wait_for(lambda: "starting the fleet degraded" in daemon.log() and daemon.log(),
                      10, "run's notice of the degraded start")
    assert "3 target(s) wait" in notice and "mounted, partial, nobinary" in notice
    doc = yaml.safe_load(fleet.read_text())
    proxy, api = doc["daemon"]["proxy"]["listen"], doc["daemon"]["api"]

    status, body = ask(proxy, "mounted")  # answered now, with the reason, not held
    assert status == 503 and "is waiting: model file" in body["error"], body
    assert ask(proxy, "good")[0] == 200
    view = json.loads(urllib.request.urlopen(f"http://{api}/v1/targets/partial", timeout=30)
                      .read())
    assert view["state"] == "waiting" and "is truncated" in view["last_event"]["reason"]

    # The mount comes back, the download finishes, the runtime is installed: no reload.
    (nas / "models").mkdir(parents=True)
    os.symlink(model, nas / "models" / "m.gguf")
    shutil.copyfile(model, cut.with_suffix(".part"))
    os.replace(cut.with_suffix(".part"), cut)
    bin_dir.mkdir(parents=True)
    os.symlink(llama_server_bin, bin_dir / "llama-server")
    for name in ("mounted", "partial", "nobinary"):
        daemon.wait_state(name, "ready", 120)
        assert ask(proxy, name)[0] == 200
    still = daemon.target("good")
    assert still["pid"] == good["pid"] and still["restarts"] == 0  # nobody else restarted
    assert not [e for e in daemon.events() if e["kind"] == "reload"]


def test_an_on_demand_target_whose_file_is_missing_answers_its_request_with_the_reason(
        tmp_path, model, llama_server_bin, start_daemon):
    later = tmp_path / "later.gguf"
    fleet = write_fleet(tmp_path, {
        "good": llama_target(model, llama_server_bin),
        "lazy": llama_target(str(later), llama_server_bin, start="on_demand"),
    })
    assert check(fleet).returncode == 2
    daemon = start_daemon(fleet)
    good = daemon.wait_state("good", "ready")
    daemon.wait_state("lazy", "unloaded", 30)
    proxy = yaml.safe_load(fleet.read_text())["daemon"]["proxy"]["listen"]
    status, body = ask(proxy, "lazy")
    assert status == 503, body
    assert "cannot load: model file" in body["error"] and "does not exist" in body["error"]
    assert "the next request tries to load it again" in body["error"]
    assert daemon.target("lazy")["state"] == "unloaded"
    assert daemon.target("good")["pid"] == good["pid"]  # nothing evicted or restarted for it
    os.symlink(model, later)
    status, body = ask(proxy, "lazy")  # looked at again when asked for: it loads now
    assert status == 200, body
    assert daemon.target("lazy")["state"] == "ready"
    assert daemon.target("good")["pid"] == good["pid"]


def test_a_reload_that_adds_a_target_whose_file_is_missing_is_applied_and_it_waits(
        tmp_path, model, llama_server_bin, start_daemon):
    import signal

    fleet = write_fleet(tmp_path, {"good": llama_target(model, llama_server_bin)})
    daemon = start_daemon(fleet)
    good = daemon.wait_state("good", "ready")
    doc = yaml.safe_load(fleet.read_text())
    doc["targets"]["added"] = llama_target(str(tmp_path / "nas" / "m.gguf"), llama_server_bin)
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon.signal(signal.SIGHUP)
    waiting = daemon.wait_state("added", "waiting", 30)
    assert "does not exist" in waiting["last_event"]["reason"]
    reload = next(e for e in daemon.events() if e["kind"] == "reload")
    assert "1 added" in reload["reason"] and "added will wait for what this host lacks" \
        in reload["reason"] and reload["data"]["waiting"] == ["added"]
    # A mistake in the file is still refused as a whole: the fleet is unchanged.
    doc["targets"]["added"]["port"] = 70000
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: any("reload rejected" in e["reason"] for e in daemon.events()), 30,
             "the bad reload to be rejected")
    assert daemon.target("added")["state"] == "waiting"
    assert daemon.target("good")["pid"] == good["pid"]
