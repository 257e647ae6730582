"""What the command line writes: into pipes that close early, onto terminals of a given
width, and for routers (issue 12, items 11 and 13)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from supervisor.cli import statusview
from tests.conftest import REPO, free_port, write_fleet

NOW = 1_700_000_000.0
LONG_REASON = ("retune: acceptance fell below the tuner's threshold over its window of drafted "
               "tokens; a shorter draft length is applied when the server is idle")


def specfleet(*args: str, env: dict[str, str] | None = None,
              stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd=REPO, check=False, timeout=60,
                          env={**os.environ, **(env or {})})


def into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run with stdout a pipe whose reader is already gone (`| head` that has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return specfleet(*args, stdout=write_end)
    finally:
        os.close(write_end)


def target(name: str, state: str, pid: int | None, **over: Any) -> dict[str, Any]:
    t = {"name": name, "state": state, "pid": pid, "started_at": NOW - 3600, "restarts": 2,
         "backend": "llamacpp",
         "speculation": {"method": "ngram", "variant": "mod", "enabled": True,
                         "draft_length": 8},
         "shown": {"acceptance_rate": 0.62, "mean_accepted_length": 3.1,
                   "tokens_per_second": 41.5, "draft_length": 8},
         "resources": {"vram_bytes": 3 << 30, "rss_bytes": 900 << 20},
         "last_event": {"time": NOW - 5, "reason": LONG_REASON}}
    t.update(over)
    return t


def fleet_status(*targets: dict[str, Any]) -> dict[str, Any]:
    return {"daemon": {"pid": 1, "create_time": 0.0, "updated": NOW - 60,
                       "fleet_file": "/etc/specfleet/fleet.yaml"},
            "targets": list(targets)}


def write_status(state_dir: Path, status: dict[str, Any]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "status.json").write_text(json.dumps(status))


# --- item 11: pipes ---

def test_status_into_a_pipe_that_closed_exits_quietly_with_141(tmp_path: Path):
    write_status(tmp_path, fleet_status(*(target(f"t{i}", "ready", 100 + i) for i in range(50))))
    done = into_a_closed_pipe("status", "--state-dir", str(tmp_path))
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


def test_export_into_a_pipe_that_closed_exits_quietly_with_141(tmp_path: Path, model: str,
                                                                llama_server_bin: str):
    fleet = write_fleet(tmp_path, {"alpha": {"model": model, "binary": llama_server_bin,
                                             "port": free_port()}})
    done = into_a_closed_pipe("export", "litellm", str(fleet))
    assert done.returncode == 141, done.stderr
    assert done.stderr == ""


# --- item 11: terminal width ---

def rendered(width: int | None, *targets: dict[str, Any]) -> list[str]:
    return statusview.render(fleet_status(*targets), alive=False, now=NOW,
                             width=width).splitlines()


def table_of(lines: list[str]) -> list[str]:
    """The header and the rows of the table."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith("TARGET"))
    return lines[start:]


def test_no_line_of_the_status_table_is_wider_than_the_terminal():
    targets = [target("gemma-ngram-long-name", "ready", 4242),
               target("qwen", "failed", None, failure_output="")]
    for width in (60, 80, 100, 120):
        lines = rendered(width, *targets)
        assert all(len(ln) <= width for ln in lines), (width, [ln for ln in lines
                                                                if len(ln) > width])
        header = next(ln for ln in lines if ln.startswith("TARGET"))
        assert header.split()[:2] == ["TARGET", "STATE"] and header.endswith("LAST EVENT")
        row = next(ln for ln in lines if ln.startswith("gemma-ngram-long-name"))
        assert row.endswith("…")  # the last event, shortened with an ellipsis


def test_a_narrow_terminal_drops_the_less_important_columns_first():
    wide = table_of(rendered(300, target("gemma", "ready", 4242)))
    narrow = table_of(rendered(60, target("gemma", "ready", 4242)))
    assert "MEMORY" in wide[0] and "PID" in wide[0] and LONG_REASON in wide[1]
    assert "MEMORY" not in narrow[0] and "PID" not in narrow[0]
    assert narrow[0].split()[:3] == ["TARGET", "STATE", "RESTARTS"]


def test_without_a_width_the_table_is_not_cut():
    lines = table_of(rendered(None, target("gemma", "ready", 4242)))
    assert LONG_REASON in lines[1] and "MEMORY" in lines[0]


def test_status_follows_the_COLUMNS_variable(tmp_path: Path):
    write_status(tmp_path, fleet_status(target("gemma", "ready", 4242)))
    for width in (80, 120):
        done = specfleet("status", "--state-dir", str(tmp_path), env={"COLUMNS": str(width)})
        assert done.returncode == 3, done.stderr  # the daemon that wrote it is not running
        lines = done.stdout.splitlines()
        assert max(map(len, lines)) <= width and table_of(lines)[1].startswith("gemma")


# --- item 11: no stale values ---

def test_a_target_loading_a_new_process_shows_no_acceptance_tokens_per_second_or_memory():
    # The status still holds the previous process's quantities one second into loading.
    header, row = table_of(rendered(None, target("gemma", "loading", 5151)))[:2]
    cell = dict(zip(("ACCEPTED", "SPEED", "MEMORY"),
                    (row[header.index(c):].split("  ")[0].strip()
                     for c in ("ACCEPTED", "SPEED", "MEMORY")), strict=True))
    assert cell == {"ACCEPTED": "-", "SPEED": "-", "MEMORY": "-"}
    assert "62%" not in row and "41.5" not in row and "rss" not in row


def test_a_failed_target_without_a_process_shows_no_memory():
    failed = target("gemma", "failed", None, resources={"rss_bytes": 900 << 20})
    table = "\n".join(rendered(None, failed))
    detail = statusview.render_target(failed, None, now=NOW)
    assert "rss" not in table and "rss" not in detail and "62%" not in detail


def test_a_ready_target_shows_its_quantities_and_memory():
    row = table_of(rendered(None, target("gemma", "ready", 4242)))[1]
    assert "62.0% 3.10 tokens/step" in row and "41.5 tok/s" in row and "VRAM 3.0 GiB, RSS 900.0 MiB" in row



# --- item 13: export for a router host ---

def missing_runtime_target(**over: Any) -> dict[str, Any]:
    """A target whose model, draft and llama-server are on another machine."""
    return {"model": "/models/not-here.gguf", "binary": "/opt/not-here/llama-server",
            "port": free_port(), **over}


def test_export_with_a_token_file_writes_a_clean_reference_and_explains_it_in_a_comment(
        tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    fleet = write_fleet(tmp_path, {"alpha": missing_runtime_target()},
                        api_token={"file": str(token)})
    done = specfleet("export", "litellm", str(fleet))
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["model_list"][0]["litellm_params"]["api_key"] == "os.environ/SPECFLEET_API_TOKEN"
    comments = [ln for ln in done.stdout.splitlines() if ln.startswith("#")]
    assert any("SPECFLEET_API_TOKEN" in ln and str(token) in ln for ln in comments), comments
    assert "s3cret" not in done.stdout


def test_json_export_keeps_stdout_pure_json_and_explains_the_key_file_on_stderr(tmp_path: Path):
    token = tmp_path / "token"
    fleet = write_fleet(tmp_path, {"alpha": missing_runtime_target()},
                        api_token={"file": str(token)})
    done = specfleet("export", "litellm", str(fleet), "--format", "json")
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert config["model_list"][0]["litellm_params"]["api_key"] == "os.environ/SPECFLEET_API_TOKEN"
    assert "SPECFLEET_API_TOKEN" in done.stderr and str(token) in done.stderr


def test_targets_with_their_own_key_files_get_one_variable_each(tmp_path: Path):
    fleet = write_fleet(tmp_path, {
        "alpha": missing_runtime_target(api_key={"file": str(tmp_path / "a.key")}),
        "beta-2": missing_runtime_target(api_key={"file": str(tmp_path / "b.key")})},
        proxy={"enabled": False})
    done = specfleet("export", "litellm", str(fleet))
    assert done.returncode == 0, done.stderr
    keys = [m["litellm_params"]["api_key"] for m in yaml.safe_load(done.stdout)["model_list"]]
    assert keys == ["os.environ/SPECFLEET_ALPHA_API_KEY", "os.environ/SPECFLEET_BETA_2_API_KEY"]
    assert "a.key" in done.stdout and "b.key" in done.stdout


def test_export_needs_neither_the_model_files_nor_the_runtime(tmp_path: Path):
    fleet = write_fleet(tmp_path, {"alpha": missing_runtime_target(),
                                   "beta": missing_runtime_target(
                                       speculation={"method": "draft",
                                                    "draft": "/models/draft-not-here.gguf"})})
    done = specfleet("export", "litellm", str(fleet))
    assert done.returncode == 0, done.stderr
    assert [m["model_name"] for m in yaml.safe_load(done.stdout)["model_list"]] == ["alpha", "beta"]
    # Still said, as warnings on stderr; `check` keeps them errors.
    assert "not-here.gguf" in done.stderr and "warning" in done.stderr
    assert specfleet("check", str(fleet)).returncode == 2


def test_a_key_file_becomes_a_reference_with_nothing_but_the_variable_name(tmp_path: Path):
    from supervisor.api import litellm
    from supervisor.config.loader import load_fleet

    fleet = load_fleet(write_fleet(tmp_path, {"alpha": missing_runtime_target()},
                                   api_token={"file": str(tmp_path / "token")})).fleet
    key = litellm.config(fleet)["model_list"][0]["litellm_params"]["api_key"]
    assert re.fullmatch(r"os\.environ/[A-Z_][A-Z0-9_]*", key), key
    assert litellm.notes(fleet) and str(tmp_path / "token") in litellm.notes(fleet)[0]


def test_a_rejected_reload_is_shown_above_the_table_until_a_reload_succeeds():
    status = fleet_status(target("a", "ready", 123))
    status["daemon"]["rejected_reload"] = {
        "time": 1000.0, "file": "/etc/specfleet/fleet.yaml",
        "problems": [f"/etc/specfleet/fleet.yaml:{n}:3: targets.a.prot: unknown key"
                     for n in range(7)]}
    text = statusview.render(status, alive=True, now=1090.0, width=200)
    assert "reload rejected 1m30s ago: 7 problem(s) in /etc/specfleet/fleet.yaml" in text
    assert "fleet.yaml:0:3: targets.a.prot: unknown key" in text
    assert "... and 2 more" in text
    status["daemon"]["rejected_reload"] = None
    assert "reload rejected" not in statusview.render(status, alive=True, now=1090.0)


def test_with_the_daemon_gone_states_are_shown_as_what_they_were():
    status = fleet_status(target("a", "ready", 123))
    gone = statusview.render(status, alive=False, now=NOW, width=200)
    assert "was ready" in gone and "daemon is not running" in gone
    assert "was ready" not in statusview.render(status, alive=True, now=NOW, width=200)


def test_status_says_when_the_tuner_waits_for_a_drafter_to_warm_up():
    t = target("m", "ready", 41, tuning={"setting": "n=8", "warming_tokens_left": 340})
    assert ("tuning       the drafter is warming up after its start: judged after 340 more "
            "tokens") in statusview.render_target(t, None, now=NOW)
    t["tuning"]["warming_tokens_left"] = 0
    assert "warming" not in statusview.render_target(t, None, now=NOW)


def test_status_shows_loading_on_demand_for_targets_that_use_it():
    view = {"start": "on_demand", "idle_unload": 600.0, "evictable": False, "group": None,
            "loads": 3, "unloads": {"idle": 2, "evicted": 1}, "cold_start_s": 1.84,
            "load_refused": None}
    detail = statusview.render_target(target("c", "unloaded", None, on_demand=view), None,
                                      now=NOW)
    assert ("on demand    start on_demand, loads 3, unloads 2 idle, 1 evicted, last cold "
            "start 1.84 s") in detail
    assert "idle_unload 10m00s, pinned (evictable: false)" in detail
    always = {**view, "start": "always", "idle_unload": None}
    assert "on demand" not in statusview.render_target(target("a", "ready", 7, on_demand=always),
                                                       None, now=NOW)


def test_a_fleet_file_given_relative_is_shown_by_its_absolute_path(tmp_path):
    fleet = write_fleet(tmp_path, {})
    daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", fleet.name],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    status = tmp_path / "state" / "status.json"
    try:
        for _ in range(300):
            if status.exists() and json.loads(status.read_text() or "{}").get("daemon"):
                break
            time.sleep(0.1)
        shown = json.loads(status.read_text())["daemon"]["fleet_file"]
    finally:
        daemon.terminate()
        daemon.communicate(timeout=30)
    assert shown == str(fleet) and Path(shown).is_absolute()


def test_the_restarts_column_counts_what_the_page_counts():
    """The page says "0 after failures (2 retune)"; the table once said only "0"."""
    row = table_of(rendered(None, target("gemma", "ready", 4242, restarts=0,
                                         restarts_by_reason={"retune": 2})))[1]
    assert " 0 (2 retune) " in row
    plain = table_of(rendered(None, target("gemma", "ready", 4242)))[1]
    assert " 2 " in plain and "(" not in plain.split("4242")[1].split("ngram")[0]
