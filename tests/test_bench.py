"""`specfleet bench` on the quickstart fleet, with the real llama-server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from supervisor.bench.runner import OFF, RunResult, recommend, summarize, sweep_lengths
from tests.conftest import REPO, free_port


def test_sweep_covers_powers_of_two_the_bounds_and_the_current_length():
    assert sweep_lengths(2, 24, 6) == [2, 4, 6, 8, 16, 24]
    assert sweep_lengths(1, 1, None) == [1]


def test_speedups_are_against_speculation_off_in_the_same_run():
    results = [RunResult(OFF, "code", 1, 100, 2.0, 0, 0), RunResult(OFF, "code", 2, 100, 2.0, 0, 0),
               RunResult("8", "code", 1, 100, 1.0, 80, 60), RunResult("8", "code", 2, 100, 1.0, 80, 60),
               RunResult(OFF, "prose", 1, 100, 2.0, 0, 0), RunResult("8", "prose", 1, 100, 4.0, 80, 8)]
    rows = {(s.setting, s.workload): s for s in summarize(results)}
    assert rows[("8", "code")].speedup == pytest.approx(2.0)
    assert rows[("8", "code")].acceptance == pytest.approx(0.75)
    assert rows[("8", "prose")].speedup == pytest.approx(0.5)
    best, per_workload = recommend(list(rows.values()))
    assert per_workload == {"code": "8", "prose": OFF}
    assert best == OFF  # geometric mean of 2.0 and 0.5 is 1.0: a tie goes to off


@pytest.mark.live
def test_bench_writes_the_table_json_and_png_for_a_quickstart_target(
        tmp_path, gemma_model, llama_server_bin):
    doc = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    for target in doc["targets"].values():
        target["port"] = free_port()
    doc["daemon"] = {"state_dir": str(tmp_path / "state")}
    fleet = tmp_path / "quickstart.yaml"
    fleet.write_text(yaml.safe_dump(doc))
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "bench", str(fleet), "--target", "gemma-ngram",
         "--runs", "2", "--lengths", "4,16", "--classes", "code", "--max-tokens", "32",
         "--out", str(out)], capture_output=True, text=True, cwd=REPO, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "[3/3] starting the server with draft length 16" in proc.stderr  # progress
    table = proc.stdout.splitlines()
    assert table[0].split() == ["workload", "setting", "tok/s", "±", "acceptance", "speedup"]
    assert [ln.split()[:2] for ln in table[1:4]] == [["code", "off"], ["code", "n=4"],
                                                     ["code", "n=16"]]
    assert "recommended for this mix of workloads:" in proc.stdout
    report = json.loads((out / "bench.json").read_text())
    assert len(report["results"]) == 6  # 3 settings x 1 workload x 2 runs
    assert "--spec-ngram-mod-n-max 16" in report["commands"]["16"]
    assert "--spec-type" not in report["commands"][OFF]
    drafted = [r for r in report["results"] if r["setting"] != OFF]
    assert all(r["draft_tokens"] > 0 for r in drafted)
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
