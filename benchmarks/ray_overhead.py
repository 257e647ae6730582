"""What Ray costs a target: streamed tokens/s and time to first token through specfleet's
proxy for a target under `launcher: ray` against the same target under `launcher:
process`, as ratios measured in one run; also each target's start time (starting to
ready).

    .venv/bin/python benchmarks/ray_overhead.py [--pairs 40] [--max-tokens 48]

Needs the ray extra (pip install 'specfleet[ray]'). One `specfleet run` with two identical
llama-server targets (gemma-3-270m Q4_K_M, CPU, one thread each): `proc` as a child of the
daemon, `ray` as an actor on a one-node Ray cluster this script starts (`ray start --head`,
one CPU in Ray's books, 100 MB object store, no dashboard) and stops. Requests alternate
proc / ray (ABAB..., one at a time, the order flipped every pair) so that drift of the
machine hits both alike; ratios are medians of per-pair ratios. The runtime is the same
binary on the same machine either way: what differs is the actor in between (the runtime's
parent, its output relayed by long polls) and Ray's own processes in the background.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.proxy_overhead import stream_once  # noqa: E402
from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(temp_dir: str) -> str:
    port = free_port()
    subprocess.run([RAY, "start", "--head", "--port", str(port), "--num-cpus", "1",
                    "--num-gpus", "0", "--object-store-memory", "100000000",
                    "--include-dashboard", "false", "--disable-usage-stats",
                    "--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir],
                   check=True, stdout=subprocess.DEVNULL, timeout=180)
    return f"127.0.0.1:{port}"


def stop_cluster(temp_dir: str) -> None:
    procs = [p for p in psutil.process_iter(["cmdline"])
             if temp_dir in " ".join(p.info["cmdline"] or [])]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


def wait_ready(state: Path, timeout: float = 300) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = json.loads((state / "status.json").read_text())
            targets = {t["name"]: t for t in status["targets"]}
            if targets and all(t["state"] == "ready" for t in targets.values()):
                return targets
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise SystemExit("the targets did not become ready")


def start_seconds(state: Path) -> dict[str, float]:
    """Seconds from `starting` to `ready` of each target's first start."""
    began, out = {}, {}
    for line in (state / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") != "state":
            continue
        if e.get("new") == "starting":
            began.setdefault(e["target"], e["time"])
        elif e.get("new") == "ready" and e["target"] not in out:
            out[e["target"]] = round(e["time"] - began[e["target"]], 3)
    return out


async def measure(proxy: str, pairs: int, max_tokens: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {f"{k}_{s}": [] for k in ("ttft", "tps") for s in ("proc", "ray")}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(3):  # warm-up, not counted
            for side in ("proc", "ray"):
                await stream_once(s, proxy, side, max_tokens)
        for i in range(pairs):
            order = ["proc", "ray"] if i % 2 == 0 else ["ray", "proc"]
            for side in order:
                ttft, tps, _ = await stream_once(s, proxy, side, max_tokens)
                out[f"ttft_{side}"].append(ttft)
                out[f"tps_{side}"].append(tps)
    return out


def fleet_doc(work: Path, address: str, binary: str, model: str, proxy_port: int) -> dict:
    def target(launcher: str) -> dict:
        return {"model": model, "binary": binary, "port": free_port(), "launcher": launcher,
                # One generation thread: the other core is left to the client and specfleet.
                "args": ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"],
                "tuning": {"enabled": False}}
    return {"version": 1,
            "daemon": {"state_dir": str(work / "state"), "api": f"127.0.0.1:{free_port()}",
                       "proxy": {"listen": f"127.0.0.1:{proxy_port}"},
                       "ray": {"address": address, "namespace": "bench"},
                       "stop_targets_on_exit": True},
            "targets": {"proc": target("process"), "ray": target("ray")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ray_overhead.json"))
    args = parser.parse_args()
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr)
    binary = str(provision.cached_llama_server() or provision.build_llama_server(progress=progress))
    model = str(assemble_example_model(progress=progress))
    work = Path(tempfile.mkdtemp(prefix="specfleet-ray-bench-"))
    temp_dir = tempfile.mkdtemp(prefix="sf-ray-", dir="/tmp")
    proxy_port = free_port()
    daemon = None
    try:
        began = time.monotonic()
        address = start_cluster(temp_dir)
        cluster_s = time.monotonic() - began
        fleet = work / "fleet.yaml"
        fleet.write_text(yaml.safe_dump(fleet_doc(work, address, binary, model, proxy_port)))
        daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet)],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        wait_ready(work / "state")
        starts = start_seconds(work / "state")
        print(f"measuring {args.pairs} pairs of streamed chats ({args.max_tokens} tokens) through "
              "the proxy, launcher: process vs launcher: ray...", file=sys.stderr)
        data = asyncio.run(measure(f"http://127.0.0.1:{proxy_port}", args.pairs, args.max_tokens))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(60)
        stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    tps = statistics.median(r / p for r, p in zip(data["tps_ray"], data["tps_proc"], strict=True))
    ttft = statistics.median(r / p for r, p in zip(data["ttft_ray"], data["ttft_proc"], strict=True))
    report = {"pairs": args.pairs, "max_tokens": args.max_tokens,
              "tps_ratio_ray_over_process": round(tps, 4),
              "ttft_ratio_ray_over_process": round(ttft, 4),
              "ttft_ms_median": {s: round(1000 * statistics.median(data[f"ttft_{s}"]), 2)
                                 for s in ("proc", "ray")},
              "tps_median": {s: round(statistics.median(data[f"tps_{s}"]), 2)
                             for s in ("proc", "ray")},
              "start_to_ready_s": starts, "ray_cluster_start_s": round(cluster_s, 1), "raw": data}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"streamed tokens/s, ray / process: {tps:.4f} (median of pairs)")
    print(f"time to first token, ray / process: {ttft:.4f} (median of pairs; medians "
          f"{report['ttft_ms_median']['proc']} ms process, {report['ttft_ms_median']['ray']} ms ray)")
    print(f"start to ready: {starts} s; the Ray head itself took {cluster_s:.1f} s to start")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
