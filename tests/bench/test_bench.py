"""`specfleet bench` on the quickstart fleet, with the real llama-server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from supervisor.bench import runner
from supervisor.bench.runner import OFF, RunResult, recommend, summarize, sweep_lengths
from supervisor.bench.workloads import BUILT_IN
from supervisor.config.schema import Target
from tests.conftest import REPO, free_port


def test_sweep_covers_powers_of_two_the_bounds_and_the_current_length():
    assert sweep_lengths(2, 24, 6) == [2, 4, 6, 8, 16, 24]
    assert sweep_lengths(1, 1, None) == [1]


def test_every_request_of_a_code_workload_is_a_new_text_with_the_same_shape():
    code = BUILT_IN["code"]
    texts = [code.prompt(i) for i in range(300)]
    assert len(set(texts)) == 300  # an n-gram pool never saw this request's names
    first, again = code.prompt(0), code.prompt(len(code.prompts))
    assert first != again and first.count("\n") == again.count("\n")
    # Renamed where they stand as names only: the prompt still repeats itself exactly.
    assert first.count("def parse_line_") == 2 and "partition('=')" in first
    assert BUILT_IN["prose"].prompt(4) == BUILT_IN["prose"].prompts[1]  # sampled anew anyway


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


def one_run_each() -> list[RunResult]:
    """Speculation off and n=8 on one workload, one run each, n=8 drafting 4 tokens."""
    return [RunResult(OFF, "code", 1, 100, 2.0, 0, 0), RunResult("8", "code", 1, 100, 1.9, 4, 3)]


def test_the_spread_of_a_single_run_is_unknown_not_zero():
    rows = {s.setting: s for s in summarize(one_run_each())}
    assert rows["8"].tps_stdev is None
    table = runner.render_table(list(rows.values())).splitlines()
    spread = table[0].split().index("±")
    assert [ln.split()[spread] for ln in table[1:]] == ["n/a", "n/a"]


def test_a_recommendation_from_thin_evidence_comes_with_its_caveats(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "plot", lambda *a, **k: None)
    target = Target(name="t", backend="llamacpp", model="m.gguf", port=1,
                    speculation={"method": "ngram"})
    table, json_path, _ = runner.write_report(tmp_path, target, one_run_each(), {})
    report = json.loads(json_path.read_text())
    assert report["recommended"] == "8"
    caveats = report["caveats"]
    assert any("4 drafted tokens" in c and str(runner.MIN_DRAFTED_TOKENS) in c for c in caveats)
    assert any("one run" in c for c in caveats)
    assert all(f"caveat: {c}" in table for c in caveats)
    assert "recommended for this mix of workloads: draft length 8 (tentative" in table


def test_enough_evidence_gives_a_recommendation_without_caveats():
    n = runner.MIN_DRAFTED_TOKENS
    results = [RunResult(OFF, "code", r, 100, 2.0 + r / 100, 0, 0) for r in (1, 2, 3)] + \
              [RunResult("8", "code", r, 100, 1.0 + r / 100, n, n // 2) for r in (1, 2, 3)]
    assert runner.caveats(summarize(results), "8", {"code": "8"}) == []


def test_the_plot_starts_at_zero_and_names_the_baseline_in_the_legend(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    results = [RunResult(OFF, "code", r, 100, 1.0, 0, 0) for r in (1, 2)] + \
              [RunResult(k, "code", r, 94 + 3 * int(k), 1.0, 80, 60)
               for k in ("4", "8") for r in (1, 2)]
    runner.plot(summarize(results), tmp_path / "bench.png", "t")
    (ax,) = figures[0].axes
    assert ax.get_ylim()[0] == 0  # 94 against 100 tok/s is 6 %, not a cliff
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("speculation off" in label and "code" in label for label in labels), labels
    plt.close(figures[0].number)


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
    # ngram-mod learns across requests: each of its runs had a server of its own (no run
    # drafted from what the one before it left in the pool); off ran both on one.
    starts = {name: (out / "logs" / f"bench-{name}.log").read_text().count("specfleet: starting")
              for name in (OFF, "4", "16")}
    assert starts == {OFF: 1, "4": 2, "16": 2}
    assert "a fresh server: its drafter learns" in proc.stderr
