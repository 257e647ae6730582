"""The short soak in CI: benchmarks/soak.py until every fault kind has been done once under
traffic (their order drawn from the seed; at most 10 minutes), with the same invariants the
2-hour run records in benchmarks/results/ (docs/reliability.md, "The soak"). The daemon's
RSS slope is left to the long run: minutes of a daemon that starts, loads and is killed say
nothing about a leak.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.soak

MINUTES = 10
# Fault kinds every machine can do (a container needs podman, a full state dir root).
EVERYWHERE = {"kill_runtime", "stop_runtime", "kill_daemon", "reload_changed", "reload_broken",
              "api_restart", "model_gone", "truncated_then_whole", "key_rotated"}


def test_every_fault_kind_under_traffic_loses_no_request_and_leaves_nothing_behind(
        tmp_path, gemma_model, llama_server_bin):
    result_path = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"),
                          "--minutes", str(MINUTES), "--seed", "8", "--each-first", "--until-each",
                          "--result", str(result_path)],
                         capture_output=True, text=True, timeout=MINUTES * 60 + 600,
                         check=False, cwd=REPO)
    assert result_path.exists(), run.stderr[-4000:]
    result = json.loads(result_path.read_text())
    summary = result["summary"]
    faults = {r["fault"] for r in result["faults"]}
    assert faults >= EVERYWHERE, (faults, run.stderr[-3000:])
    assert summary["requests"] > 100 and summary["lost"] == 0, result["lost"]
    assert summary["orphans"] == 0, result["orphans"]
    assert summary["not_recovered_in_bound"] == 0, [
        r for r in result["faults"] if r["recovered_s"] is None]
    assert summary["status_event_mismatches"] == 0, result["mismatches"]
    assert summary["unreadable_state_files"] == 0, result["state_files"]
    assert summary["poll_errors"] == 0, result["poll_errors"]
    assert summary["daemon_exit"] == 0, run.stderr[-3000:]
