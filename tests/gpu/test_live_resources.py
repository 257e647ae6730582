"""Resource monitor and run records against the real llama-server; VRAM attribution by tree."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import psutil

from supervisor.gpu import nvml as gpus
from supervisor.gpu.monitor import _Trees, headroom_alerts, read_all
from tests.conftest import REPO, llama_target, wait_for, write_fleet


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_run_record_says_what_actually_ran_and_status_shows_it(
        tmp_path, model, gemma_model, llama_server_bin, start_daemon):
    fleet = write_fleet(tmp_path, {"chat": llama_target(model, llama_server_bin)},
                        gpu={"interval": "0.5s"})
    daemon = start_daemon(fleet)
    pid = daemon.wait_state("chat", "ready")["pid"]
    record_path = daemon.state_dir / "runs" / "chat.json"
    record = wait_for(lambda: (r := json.loads(record_path.read_text()))["files"]["model"]
                      ["sha256"] and r, 60, "the model's sha256 in the run record")
    assert record["pid"] == pid
    assert record["argv"] == psutil.Process(pid).cmdline()
    assert record["runtime"]["binary"] == llama_server_bin
    said = subprocess.run([llama_server_bin, "--version"], capture_output=True, text=True,
                          check=False)
    assert f"version: {record['runtime']['version']}" in said.stdout + said.stderr
    assert record["files"]["model"]["sha256"] == sha256(gemma_model)
    assert record["files"]["model"]["size"] == os.path.getsize(gemma_model)

    # The monitor: the server's RSS (its tree), and no GPU said plainly.
    usage = wait_for(lambda: daemon.target("chat").get("resources", {}).get("rss_bytes"), 30,
                     "the monitor's reading")
    assert usage > 50 << 20
    if not gpus.read().gpus:
        assert daemon.status()["daemon"]["gpus"]["unavailable"].startswith("no NVIDIA GPU")
        assert daemon.target("chat")["resources"]["vram_bytes"] is None

    shown = subprocess.run([sys.executable, "-m", "supervisor", "status", "--state-dir",
                            str(daemon.state_dir), "--target", "chat"],
                           capture_output=True, text=True, cwd=REPO, check=False)
    assert shown.returncode == 0, shown.stderr
    assert f"sha256 {sha256(gemma_model)}" in shown.stdout
    assert "--metrics" in shown.stdout and f"pid {pid}" in shown.stdout

    os.kill(pid, signal.SIGKILL)
    second = wait_for(lambda: (t := daemon.target("chat")).get("state") == "ready"
                      and t["pid"] != pid and t["pid"], 60, "the restart")
    history = wait_for(lambda: [json.loads(line) for line in (
        daemon.state_dir / "runs" / "chat.jsonl").read_text().splitlines()
        if json.loads(line)["pid"] == second], 30, "the second launch in the history")
    assert history[-1]["reason"] == "restart after crash"
    assert len((daemon.state_dir / "runs" / "chat.jsonl").read_text().splitlines()) == 2


def test_vram_is_attributed_to_the_whole_process_tree():
    # A runtime whose memory is held by a child it forked (vLLM's engine core, Ollama's runner).
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        child = wait_for(lambda: psutil.Process(proc.pid).children(), 10, "the child")[0].pid
        snapshot = gpus.GpuSnapshot((gpus.GpuReading(0, "H200", "GPU-0", 100, 60, 40, 5, 40,
                                                     {child: 30, 999999: 20}),))
        trees = _Trees()
        tree, rss, _ = trees.usage(proc.pid)
        assert tree == {proc.pid, child} and rss > 0
        assert gpus.attribute(snapshot, tree) == {0: 30}  # the other process is not ours
    finally:
        proc.kill()
        proc.wait()


def test_headroom_alerts_fire_once_when_crossing_and_once_when_recovering():
    def snap(free):
        return gpus.GpuSnapshot((gpus.GpuReading(0, "H200", "GPU-0", 100 << 30, 0, free, 0, 40),))
    alerts, low = headroom_alerts(snap(512 << 20), 1 << 30, frozenset())
    assert [a.low for a in alerts] == [True] and "below the 1.00 GiB headroom" in alerts[0].message
    alerts, low = headroom_alerts(snap(256 << 20), 1 << 30, low)
    assert alerts == []
    alerts, low = headroom_alerts(snap(4 << 30), 1 << 30, low)
    assert [a.low for a in alerts] == [False] and low == frozenset()


def test_without_a_gpu_the_monitor_reads_processes_and_says_why_there_is_no_vram():
    snapshot, usage = read_all({"me": os.getpid()}, _Trees())
    assert usage["me"]["rss_bytes"] > 0
    if not snapshot.gpus:
        assert snapshot.unavailable and "NVML" in snapshot.unavailable
        assert usage["me"]["vram_bytes"] is None
