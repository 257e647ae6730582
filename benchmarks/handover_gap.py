"""What a planned restart costs the clients: the longest gap in served tokens and the failed
requests while a target restarts under steady streaming traffic, beside the old server
(supervision/handover.py) against in place, and against no restart at all.

    .venv/bin/python benchmarks/handover_gap.py [--rounds 3] [--clients 2] [--tokens 48]

`specfleet run` supervises two llama-server targets of the packaged model (gemma-3-270m
Q4_K_M, CPU, `--ctx-size 512 --parallel 2 --threads 1`, n-gram speculation, tuning off):
`beside` with the default `restart.replace: auto` and `inplace` with `in_place`. Each round,
for each target in turn (the order alternates between rounds) and for a quiet control
window of the same length on the `beside` target:

  --clients streaming clients send completions of --tokens tokens through the proxy back
  to back (each prompt distinct); after 5 s, `POST /v1/targets/NAME/restart` (none in the
  control window); the window ends 5 s after the old server is gone and the target is
  ready again.

Reported per mode: the longest gap between two streamed chunks any client saw (a request's
first chunk counts from the end of the client's previous request, so time spent waiting
for a restarting target is a gap), failed requests, and tokens served; as ratios to the
control window's longest gap, measured in the same run. Nothing survives the script.
Writes benchmarks/results/handover_gap.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from daemon_overhead import Daemon, others_running  # noqa: E402
from serverproc import free_port  # noqa: E402

from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402


class Streams:
    """`clients` threads streaming completions through the proxy, each recording the time
    of every chunk and every request's outcome."""

    def __init__(self, proxy: str, model: str, clients: int, tokens: int) -> None:
        self.proxy, self.model, self.tokens = proxy, model, tokens
        self.stop = threading.Event()
        self.chunks: list[list[float]] = [[] for _ in range(clients)]
        self.failed: list[str] = []
        self.ok = 0
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            body = json.dumps({"model": self.model, "stream": True, "temperature": 0.7,
                               "max_tokens": self.tokens,
                               "prompt": f"Story {i}-{n}-{time.time():.3f}: once upon a time"})
            req = urllib.request.Request(f"{self.proxy}/v1/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    done = False
                    for line in resp:
                        if line.startswith(b"data: "):
                            self.chunks[i].append(time.monotonic())
                            done = done or line.strip() == b"data: [DONE]"
                    if not done:
                        self.failed.append("stream cut (no [DONE])")
                    else:
                        self.ok += 1
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                self.failed.append(repr(exc)[:200])
                time.sleep(0.2)

    def end(self) -> dict[str, Any]:
        self.stop.set()
        for t in self.threads:
            t.join(300)
        gaps = [b - a for times in self.chunks for a, b in itertools.pairwise(times)]
        return {"longest_gap_s": round(max(gaps), 3) if gaps else None,
                "median_gap_s": round(statistics.median(gaps), 4) if gaps else None,
                "chunks": sum(len(c) for c in self.chunks), "requests_ok": self.ok,
                "requests_failed": len(self.failed), "failures": self.failed[:5]}


def fleet_file(work: Path, binary: Path, model: Path) -> tuple[Path, str, str]:
    api, proxy = free_port(), free_port()
    common = {"model": str(model), "binary": str(binary),
              "args": ["--ctx-size", "512", "--parallel", "2", "--threads", "1"],
              "speculation": {"method": "ngram"}, "tuning": {"enabled": False},
              "health": {"interval": "1s", "metrics_interval": "5s"}}
    doc = {"version": 1,
           "daemon": {"state_dir": str(work / "state"), "api": f"127.0.0.1:{api}",
                      "proxy": {"listen": f"127.0.0.1:{proxy}"}},
           "targets": {"beside": {**common, "port": free_port()},
                       "inplace": {**common, "port": free_port(),
                                   "restart": {"replace": "in_place"}}}}
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path, f"http://127.0.0.1:{api}", f"http://127.0.0.1:{proxy}"


def target(daemon: Daemon, name: str) -> dict[str, Any]:
    return next((t for t in daemon.targets() if t["name"] == name), {})


def window(daemon: Daemon, api: str, proxy: str, name: str, restart: bool,
           clients: int, tokens: int, control_s: float | None = None) -> dict[str, Any]:
    streams = Streams(proxy, name, clients, tokens)
    began = time.monotonic()
    time.sleep(5)
    pid = target(daemon, name).get("pid")
    if restart:
        urllib.request.urlopen(urllib.request.Request(
            f"{api}/v1/targets/{name}/restart", data=b"", method="POST"), timeout=10).read()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            now = target(daemon, name)
            if not psutil.pid_exists(pid) and now.get("state") == "ready" \
                    and now.get("pid") not in (None, pid):
                break
            time.sleep(0.2)
        time.sleep(5)
    else:
        time.sleep(max(0.0, (control_s or 10) - 5))
    result = streams.end()
    result["seconds"] = round(time.monotonic() - began, 1)
    result["others_running"] = others_running()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    binary = provision.cached_llama_server() or provision.build_llama_server()
    model = assemble_example_model(lambda msg: print(msg, file=sys.stderr))
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="handover-gap-") as tmp:
        fleet, api, proxy = fleet_file(Path(tmp), binary, model)
        daemon = Daemon(REPO, fleet)
        try:
            daemon.wait_ready(2)
            for r in range(args.rounds):
                order = ["beside", "inplace"] if r % 2 == 0 else ["inplace", "beside"]
                row: dict[str, Any] = {}
                for name in order:
                    row[name] = window(daemon, api, proxy, name, True, args.clients, args.tokens)
                row["control"] = window(daemon, api, proxy, "beside", False, args.clients,
                                        args.tokens, control_s=row["beside"]["seconds"])
                rounds.append(row)
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} gap {v['longest_gap_s']}s failed {v['requests_failed']}"
                    for k, v in row.items()), flush=True)
        finally:
            left = daemon.stop()
    if left:
        raise SystemExit(f"runtimes outlived the daemon: {left}")
    report(rounds, args)
    return 0


def report(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nlongest gap in streamed tokens, {args.clients} clients, {args.tokens}-token "
          "completions (ratio to the control window of the same round):")
    print(f"{'round':>5}  {'control':>8}  {'beside':>14}  {'in place':>14}  failed b/i")
    for i, row in enumerate(rounds, 1):
        c = row["control"]["longest_gap_s"] or 1e-9
        print(f"{i:>5}  {c:>7.2f}s  {row['beside']['longest_gap_s']:>6.2f}s "
              f"{row['beside']['longest_gap_s'] / c:>5.2f}x  "
              f"{row['inplace']['longest_gap_s']:>6.2f}s {row['inplace']['longest_gap_s'] / c:>5.2f}x"
              f"  {row['beside']['requests_failed']}/{row['inplace']['requests_failed']}")
    out = REPO / "benchmarks" / "results" / "handover_gap.json"
    out.write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
