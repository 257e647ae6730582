"""Benchmark: strategies under a load that alternates between one client and eight.

Issue 14, item 4 (the sweep that shows whether the optimum moves is `load_phases.py
--sweep`). On llama-server (gemma-3-270m Q4_K_M, `--parallel 8 --threads 2`), the `code`
workload (temperature 0, 96 tokens per request, ignore_eos), a cycle is a phase of one
client (--single requests one after another) and a phase of 8 concurrent clients
(--per-client requests each); every strategy runs --cycles cycles:

  off        no speculation
  fixed-K    ngram-mod with n-max K (K in --lengths; 64 is llama.cpp's default: "defaults")
  rule       the operators' rule of thumb: start at 16, after each phase double while
             acceptance > 70 %, halve below 40 % (2..64), each change a restart of the
             server whose time counts in the next phase
  tuned      `specfleet run` with tuning on (time constants scaled down: cool-down 30 s,
             min_tokens --min-tokens), ngram-mod from n-max 64 in [8, 64], requests through
             specfleet's proxy (which holds them through the tuner's restarts); first a
             warm-up of cycles until the tuner has settled (a "keep" after its baseline, or
             --warmup-minutes), then the measured cycles
  oracle     per phase kind, the best fixed setting's tokens/s in that kind (from the fixed
             runs above, same run)

Per strategy and phase kind: aggregate tokens/s (tokens / wall time of the phases,
restarts included), p50/p95 request latency. Ratios are within this run. Writes
benchmarks/results/load_mix.json.

Run: .venv/bin/python benchmarks/load_mix.py [--cycles 3] (about 20 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load_phases as lp
from phase_measure import counters, wait_for_quiet
from serverproc import http, run_clients, stop_daemon

from plugins.llamacpp import provision
from supervisor.bench.workloads import BUILT_IN
from supervisor.plugin import example_model_path

WORKLOAD = "code"
SERVER_ARGS = ["--parallel", str(lp.CLIENTS), "--ctx-size", "8192", "--threads", "2"]


def mod_flags(k: int | None) -> list[str]:
    if k is None:
        return []
    return ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", str(k),
            "--spec-ngram-mod-n-min", str(max(1, k * 3 // 4))]


def phase(send_base: str, model: str, counters_base: str | None, clients: int,
          per_client: int, max_tokens: int) -> dict[str, Any]:
    """One phase: `clients` threads, `per_client` requests each, one after another; failed
    requests are retried (a restart under the rule of thumb), their time counted."""
    prompts = BUILT_IN[WORKLOAD].prompts
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for i in range(per_client):
            body = {"model": model, "prompt": prompts[(c + i) % len(prompts)],
                    "max_tokens": max_tokens, "ignore_eos": True,
                    **BUILT_IN[WORKLOAD].sampling}
            t0 = time.monotonic()
            for _ in range(200):
                try:
                    status, raw = http(f"{send_base}/v1/completions", body, timeout=300)
                except OSError:
                    status, raw = -1, b""
                if status == 200:
                    break
                time.sleep(0.25)
            else:
                raise RuntimeError(f"request kept failing: {status} {raw[:200]!r}")
            dt = time.monotonic() - t0
            with lock:
                latencies.append(dt)
                tokens[0] += int(json.loads(raw)["usage"]["completion_tokens"])

    before = counters("llamacpp", counters_base) if counters_base else None
    seconds = run_clients(client, clients)
    acceptance = None
    if counters_base and before is not None:
        after = counters("llamacpp", counters_base)
        drafted = after["draft_tokens"] - before["draft_tokens"]
        acceptance = (after["accepted_tokens"] - before["accepted_tokens"]) / drafted \
            if drafted else None
    return {"clients": clients, "tokens": tokens[0], "seconds": seconds,
            "latencies": latencies, "acceptance": acceptance}


def cycles(send: str, model: str, counters_base: str | None, args: argparse.Namespace,
           n: int) -> list[dict[str, Any]]:
    return [phase(send, model, counters_base, clients, per, args.max_tokens)
            for _ in range(n) for clients, per in ((1, args.single), (lp.CLIENTS, args.per_client))]


def fixed(k: int | None, args: argparse.Namespace, logs: Path) -> list[dict[str, Any]]:
    server = lp.llamacpp_server(mod_flags(k), logs / f"fixed-{k}.log")
    try:
        server.wait_ready(120)
        phase(server.base, "gemma", None, 1, 1, args.max_tokens)  # warm-up, not counted
        return cycles(server.base, "gemma", server.base, args, args.cycles)
    finally:
        server.stop()


def rule(args: argparse.Namespace, logs: Path) -> tuple[list[dict[str, Any]], list[int]]:
    state = {"k": 16, "server": lp.llamacpp_server(mod_flags(16), logs / "rule-16.log")}
    state["server"].wait_ready(120)
    lengths = [16]

    def adjust(acceptance: float | None) -> float:
        k = state["k"]
        new = k if acceptance is None else (min(64, k * 2) if acceptance > 0.7
                                            else max(2, k // 2) if acceptance < 0.4 else k)
        if new == k:
            return 0.0
        t0 = time.monotonic()
        state["server"].stop()
        state["k"] = new
        state["server"] = lp.llamacpp_server(mod_flags(new), logs / f"rule-{new}.log")
        state["server"].wait_ready(120)
        lengths.append(new)
        return time.monotonic() - t0

    try:
        out = []  # the server is replaced on a change: each phase takes the current one
        for _ in range(args.cycles):
            for clients, per in ((1, args.single), (lp.CLIENTS, args.per_client)):
                base = state["server"].base
                r = phase(base, "gemma", base, clients, per, args.max_tokens)
                r["seconds"] += adjust(r["acceptance"])
                out.append(r)
        return out, lengths
    finally:
        state["server"].stop()


class Daemon:
    """`specfleet run` on a one-target fleet with tuning on and the proxy."""

    def __init__(self, workdir: Path, args: argparse.Namespace) -> None:
        self.dir = workdir
        workdir.mkdir(parents=True)
        self.proxy_port, self.port = lp.free_port(), lp.free_port()
        binary = provision.cached_llama_server() or provision.build_llama_server()
        fleet = {"version": 1, "daemon": {
            "state_dir": str(workdir / "state"), "api": f"127.0.0.1:{lp.free_port()}",
            "proxy": {"listen": f"127.0.0.1:{self.proxy_port}"}},
            "targets": {"t": {
                "backend": "llamacpp", "model": str(example_model_path()),
                "binary": str(binary), "port": self.port, "args": SERVER_ARGS,
                "speculation": {"method": "ngram", "variant": "mod",
                                "length": {"start": 64, "min": 8, "max": 64}},
                "health": {"interval": "1s", "metrics_interval": "1s"},
                "restart": {"stop_grace": "2s"},
                "tuning": {"enabled": True, "min_tokens": args.min_tokens, "min_steps": 40,
                           "cooldown": "30s", "max_wait": "5s", "reprobe": "120s"}}}}
        (workdir / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        self.err = (workdir / "daemon.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run",
                                      str(workdir / "fleet.yaml")], cwd=lp.REPO,
                                     stderr=self.err, stdout=subprocess.DEVNULL,
                                     start_new_session=True)
        self.send = f"http://127.0.0.1:{self.proxy_port}"
        self.server = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while self.state() != "ready":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("daemon or target did not come up:\n"
                                   + (workdir / "daemon.log").read_text()[-2000:])
            time.sleep(0.2)

    def state(self) -> str | None:
        try:
            return json.loads((self.dir / "state" / "status.json").read_text()
                              )["targets"][0].get("state")
        except (OSError, ValueError, IndexError, KeyError):
            return None

    def tuning_events(self) -> list[dict[str, Any]]:
        path = self.dir / "state" / "events.jsonl"
        if not path.exists():
            return []
        events = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return [e for e in events if e.get("kind") == "tuning"]

    def quiet_for(self) -> float:
        """Seconds since the last tuning event (since start when there is none)."""
        events = self.tuning_events()
        return time.time() - float(events[-1]["time"]) if events else float("inf")

    def stop(self) -> None:
        stop_daemon(self.proc, 60)
        self.err.close()


def tuned(args: argparse.Namespace, logs: Path) -> tuple[list[dict[str, Any]], list[dict]]:
    d = Daemon(logs / "tuned", args)
    try:
        deadline = time.monotonic() + 60 * args.warmup_minutes
        settled = False
        while time.monotonic() < deadline and not settled:
            cycles(d.send, "t", None, args, 1)
            state = json.loads((d.dir / "state" / "status.json").read_text())["targets"][0]
            last = ((state.get("tuning") or {}).get("last_decision") or {})
            acts = [e["data"].get("action") for e in d.tuning_events()]
            # Settled: its baseline is measured and the last evaluation kept the setting.
            settled = "restore" in acts and last.get("measured_speedup") is not None and \
                not (state.get("tuning") or {}).get("pending") and d.quiet_for() > 35
        print(f"  tuned: warm-up {'settled' if settled else 'timed out'}; decisions "
              f"{[e['data'].get('action') for e in d.tuning_events()]}", file=sys.stderr)
        warm_events = len(d.tuning_events())
        out = cycles(d.send, "t", d.server, args, args.cycles)
        return out, [{"action": e["data"].get("action"), "reason": e.get("reason"),
                      "old": e["data"].get("old_length"), "new": e["data"].get("new_length"),
                      "in_measured_cycles": i >= warm_events}
                     for i, e in enumerate(d.tuning_events())]
    finally:
        d.stop()


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in (1, lp.CLIENTS):
        sel = [r for r in rows if r["clients"] == kind]
        lat = [x for r in sel for x in r["latencies"]]
        out[str(kind)] = {"tps": round(sum(r["tokens"] for r in sel)
                                       / sum(r["seconds"] for r in sel), 2),
                          "p50_s": round(lp.percentile(lat, 50), 3),
                          "p95_s": round(lp.percentile(lat, 95), 3)}
    out["total_tps"] = round(sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--single", type=int, default=6)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lengths", default="8,16,32,64")
    ap.add_argument("--min-tokens", type=int, default=3000,
                    help="the tuner's min_tokens: about one cycle, so that its baseline "
                         "run sees both loads (3000)")
    ap.add_argument("--warmup-minutes", type=float, default=8.0)
    ap.add_argument("--quiet-wait", type=float, default=600.0,
                    help="seconds to wait for other heavy jobs before each strategy (600)")
    ap.add_argument("--out", default=str(lp.REPO / "benchmarks" / "results" / "load_mix.json"))
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="specfleet-load-mix-"))
    print(f"logs: {logs}", file=sys.stderr)
    results: dict[str, Any] = {}
    shared: dict[str, list[str]] = {}

    def strategy(name: str, run, **extra_of) -> None:
        # Other people's heavy jobs share the 2 cores: wait for them (recorded if in vain).
        if others := wait_for_quiet(args.quiet_wait):
            shared[name] = others
        started = time.monotonic()
        rows, extra = run()
        results[name] = {**summarise(rows), **({extra_of["key"]: extra} if extra_of else {}),
                         "minutes": round((time.monotonic() - started) / 60, 1)}
        print(f"  {name}: {results[name]}", file=sys.stderr)

    try:
        for k in [None, *(int(x) for x in args.lengths.split(","))]:
            strategy("off" if k is None else f"fixed-{k}",
                     lambda k=k: (fixed(k, args, logs), None))
        strategy("rule", lambda: rule(args, logs), key="lengths")
        strategy("tuned", lambda: tuned(args, logs), key="decisions")
    finally:
        for server in list(lp.Server.live):
            server.stop()
    report = analyse(results)
    Path(args.out).write_text(json.dumps({
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "benchmarks/load_mix.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(), "args": {k: v for k, v in vars(args).items() if k != "out"},
        "shared": shared, "results": results, "report": report}, indent=1) + "\n")
    print("\n".join(report))
    return 0


def analyse(results: dict[str, Any]) -> list[str]:
    fixed_names = [n for n in results if n == "off" or n.startswith("fixed-")]
    kinds = ("1", str(lp.CLIENTS))
    oracle = {k: max(fixed_names, key=lambda n, k=k: results[n][k]["tps"]) for k in kinds}
    best_single = max(fixed_names, key=lambda n: results[n]["total_tps"])
    lines = [f"{'strategy':<10}" + "".join(f"{k + ' client(s) tok/s':>20}{'p50/p95 s':>14}"
                                            for k in kinds) + f"{'whole run':>12}"]
    for name, r in results.items():
        lines.append(f"{name:<10}" + "".join(
            f"{r[k]['tps']:>20.1f}{r[k]['p50_s']:>7.2f}/{r[k]['p95_s']:<6.2f}" for k in kinds)
            + f"{r['total_tps']:>12.1f}")
    t = results["tuned"]
    lines.append("oracle per phase: " + ", ".join(
        f"{k} client(s) -> {oracle[k]} ({results[oracle[k]][k]['tps']:.1f})" for k in kinds))
    lines.append("tuned / oracle per phase: " + ", ".join(
        f"{t[k]['tps'] / results[oracle[k]][k]['tps']:.2f}" for k in kinds) + "  (goal >= 0.95)")
    lines.append("tuned / off per phase: " + ", ".join(
        f"{t[k]['tps'] / results['off'][k]['tps']:.2f}" for k in kinds) + "  (goal >= 1.00)")
    lines.append(f"tuned / best single fixed setting ({best_single}), whole run: "
                 f"{t['total_tps'] / results[best_single]['total_tps']:.2f}  (goal >= 1.10)")
    lines.append(f"tuned / rule of thumb, whole run: "
                 f"{t['total_tps'] / results['rule']['total_tps']:.2f}; tuned / defaults "
                 f"(fixed-64): {t['total_tps'] / results.get('fixed-64', t)['total_tps']:.2f}")
    lines.append("tuning decisions: " + "; ".join(
        f"{e['action']} {e['old']}->{e['new']}" + (" (measured)" if e["in_measured_cycles"]
                                                    else "") for e in t["decisions"]))
    return lines


if __name__ == "__main__":
    sys.exit(main())
