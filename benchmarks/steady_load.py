"""Benchmark: the tuner with its default settings under traffic that never stops and
alternates between one client and eight.

Issue 29's acceptance: the first decision within minutes, and at the end at or above
speculation off at each load level; issue 47's (item 8): the first decision within 2
minutes, and every tuned phase's second half at or above off's at its load. One
`specfleet run` daemon, its proxy on, two targets on the packaged gemma-3-270m Q4_K_M
(`--parallel 8 --threads 2`):

  tuned   `speculation: {method: ngram, variant: mod, variants: auto}` and
          `tuning: {enabled: true}`, nothing else: production's defaults (min_tokens 1000,
          min_steps 200, max_wait 10 min; `variants` is accepted, not searched); with the
          proxy on, a restart goes beside the running server (`restart.replace: auto`)
  off     no speculation

The workload: the built-in code prompts at temperature 0, a new text for every request
(`Workload.prompt` renames the identifiers, so that ngram-mod's pool cannot draft an answer
it saw), --max-tokens tokens with ignore_eos. Phases of --phase-seconds alternate one client
and eight concurrent clients with no pause between them (a client starts no request after
the phase's end; the phase lasts until its last request is answered). Off runs --off-cycles
cycles before the tuned run and as many after it: the two brackets' spread is the drift of
the run. Tuned runs --tuned-cycles cycles; its last --final cycles are where it ends.

Per load level: aggregate tokens/s (completion tokens / phase wall time), failed requests;
per phase also its second half's (the tokens answered after its middle over the time since).
The first decision is the first tuning event with an action, a "keep" included.
Ratios are within this run. Writes benchmarks/results/steady_load.json.

Run: .venv/bin/python benchmarks/steady_load.py [--tuned-cycles 7] [--phase-seconds 100]
(about 35 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugins.llamacpp import provision  # noqa: E402
from supervisor.bench.workloads import BUILT_IN  # noqa: E402
from supervisor.plugin import example_model_path  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from phase_measure import CLIENTS, wait_for_quiet  # noqa: E402
from serverproc import free_port, http, run_clients, stop_daemon  # noqa: E402

LEVELS = (1, CLIENTS)
SERVER_ARGS = ["--parallel", str(CLIENTS), "--ctx-size", "8192", "--threads", "2"]


class Daemon:
    """`specfleet run` with the two targets, both started at once and kept running."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        binary = provision.cached_llama_server() or provision.build_llama_server()
        common = {"backend": "llamacpp", "model": str(example_model_path()),
                  "binary": str(binary), "args": SERVER_ARGS}
        self.proxy = free_port()
        fleet = {"version": 1, "daemon": {
            "state_dir": str(workdir / "state"), "api": f"127.0.0.1:{free_port()}",
            "proxy": {"listen": f"127.0.0.1:{self.proxy}"}},
            "targets": {
                "tuned": {**common, "port": free_port(), "tuning": {"enabled": True},
                          "speculation": {"method": "ngram", "variant": "mod",
                                          "variants": "auto"}},
                "off": {**common, "port": free_port()}}}
        (workdir / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        self.err = (workdir / "daemon.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run",
                                      str(workdir / "fleet.yaml")], cwd=REPO,
                                     stderr=self.err, stdout=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 300
        while self.states() != {"tuned": "ready", "off": "ready"}:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("daemon or targets did not come up:\n"
                                   + (workdir / "daemon.log").read_text()[-2000:])
            time.sleep(0.5)

    def states(self) -> dict[str, Any]:
        try:
            raw = json.loads((self.dir / "state" / "status.json").read_text())
            return {t["name"]: t.get("state") for t in raw["targets"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def tuning(self) -> dict[str, Any]:
        raw = json.loads((self.dir / "state" / "status.json").read_text())
        return next(t.get("tuning") or {} for t in raw["targets"] if t["name"] == "tuned")

    def decisions(self) -> list[dict[str, Any]]:
        path = self.dir / "state" / "events.jsonl"
        events = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return [e for e in events if e.get("kind") == "tuning" and e.get("target") == "tuned"]

    def stop(self) -> None:
        stop_daemon(self.proc, 90)
        self.err.close()


def phase(send: str, target: str, clients: int, seconds: float, max_tokens: int,
          numbers: itertools.count) -> dict[str, Any]:
    """`clients` clients, each sending one request after another until `seconds` are over."""
    work = BUILT_IN["code"]
    tokens, failed = [0], [0]
    done: list[tuple[float, int]] = []  # (monotonic time answered, tokens)
    lock = threading.Lock()
    begin = time.monotonic()
    end = begin + seconds

    def client(_: int) -> None:
        while time.monotonic() < end:
            with lock:
                i = next(numbers)
            body = {"model": target, "prompt": work.prompt(i), "max_tokens": max_tokens,
                    "ignore_eos": True, **work.sampling}
            try:
                status, raw = http(f"{send}/v1/completions", body, timeout=600)
            except OSError:
                status, raw = -1, b""
            with lock:
                if status == 200:
                    n = int(json.loads(raw)["usage"]["completion_tokens"])
                    tokens[0] += n
                    done.append((time.monotonic(), n))
                else:
                    failed[0] += 1

    started = time.time()
    wall = run_clients(client, clients)
    # The second half: the tokens answered after the phase's middle over the time since,
    # where a tuner that reacts to the load has had half a phase to do it.
    middle = begin + wall / 2
    late = sum(n for t, n in done if t >= middle)
    return {"target": target, "clients": clients, "started": started, "seconds": wall,
            "tokens": tokens[0], "failed": failed[0], "tps": round(tokens[0] / wall, 2),
            "second_half_tps": round(late / (wall / 2), 2)}


def cycles(send: str, target: str, n: int, args: argparse.Namespace,
           numbers: itertools.count) -> list[dict[str, Any]]:
    rows = []
    for c in range(n):
        for clients in LEVELS:
            rows.append({**phase(send, target, clients, args.phase_seconds, args.max_tokens,
                                 numbers), "cycle": c})
            print(f"  {target} cycle {c} {clients} client(s): {rows[-1]['tps']} tok/s, "
                  f"{rows[-1]['failed']} failed", file=sys.stderr)
    return rows


def second_halves(tuned: list[dict[str, Any]], off: list[dict[str, Any]]
                  ) -> dict[str, list[float]]:
    """Per level, each tuned phase's second half over off's second halves (both brackets),
    in the order they ran."""
    out = {}
    for k in LEVELS:
        base = [r["second_half_tps"] for r in off if r["clients"] == k]
        mean = sum(base) / len(base)
        out[str(k)] = [round(r["second_half_tps"] / mean, 3) for r in tuned if r["clients"] == k]
    return out


def by_level(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {str(k): round(sum(r["tokens"] for r in rows if r["clients"] == k)
                          / sum(r["seconds"] for r in rows if r["clients"] == k), 2)
            for k in LEVELS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-seconds", type=float, default=100.0)
    ap.add_argument("--off-cycles", type=int, default=1)
    ap.add_argument("--tuned-cycles", type=int, default=7)
    ap.add_argument("--final", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "steady_load.json"))
    args = ap.parse_args()
    others = wait_for_quiet(600)
    root = Path(tempfile.mkdtemp(prefix="specfleet-steady-"))
    print(f"logs: {root}", file=sys.stderr)
    daemon = Daemon(root)
    numbers = itertools.count()
    send = f"http://127.0.0.1:{daemon.proxy}"
    try:
        before = cycles(send, "off", args.off_cycles, args, numbers)
        tuned = cycles(send, "tuned", args.tuned_cycles, args, numbers)
        after = cycles(send, "off", args.off_cycles, args, numbers)
        decisions, waiting = daemon.decisions(), daemon.tuning().get("waiting_for")
    finally:
        daemon.stop()
    first = tuned[0]["started"]
    made = [{"after_s": round(e["time"] - first), "action": (e.get("data") or {}).get("action"),
             "old": (e.get("data") or {}).get("old"),
             "new": (e.get("data") or {}).get("new") or (e.get("data") or {}).get("setting"),
             "reason": e.get("reason")}
            for e in decisions]
    acted = [d for d in made if d["action"]]
    final = [r for r in tuned if r["cycle"] >= args.tuned_cycles - args.final]
    off_levels = by_level(before + after)
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "benchmarks/steady_load.py", *sys.argv[1:]]),
        "cpus": os.cpu_count(), "others_running": others,
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "off": {"before": by_level(before), "after": by_level(after), "both": off_levels},
        "tuned_final": by_level(final), "tuned_cycles": by_level(tuned),
        "failed": sum(r["failed"] for r in before + tuned + after),
        "second_half_over_off": second_halves(tuned, before + after),
        "first_decision_after_s": acted[0]["after_s"] if acted else None,
        "decisions": made, "waiting_for_at_end": waiting, "phases": before + tuned + after}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(report(result)))
    return 0


def report(r: dict[str, Any]) -> list[str]:
    off, final = r["off"], r["tuned_final"]
    lines = [f"{'':<28}" + "".join(f"{k + ' client(s) tok/s':>22}" for k in map(str, LEVELS))]
    for name, row in (("off, before", off["before"]), ("off, after", off["after"]),
                      ("tuned, every cycle", r["tuned_cycles"]),
                      (f"tuned, last {r['args']['final']} cycles", final)):
        lines.append(f"{name:<28}" + "".join(f"{row[k]:>22.1f}" for k in map(str, LEVELS)))
    lines.append("tuned at the end / off (both brackets) per level: " + ", ".join(
        f"{k} client(s) {final[k] / off['both'][k]:.2f}" for k in map(str, LEVELS))
        + "  (goal >= 1.00)")
    lines.append("off after / off before per level (the drift of the run): " + ", ".join(
        f"{off['after'][k] / off['before'][k]:.2f}" for k in map(str, LEVELS)))
    halves = r["second_half_over_off"]
    lines.append("each tuned phase's second half / off's per level: " + "; ".join(
        f"{k} client(s) " + ", ".join(f"{x:.2f}" for x in halves[k]) for k in halves)
        + "  (goal: never below 1.00)")
    lines.append(f"first decision {r['first_decision_after_s']} s after the first request "
                 f"(goal: within 2 minutes); failed requests: {r['failed']}")
    lines += [f"  +{d['after_s']}s {d['action']} {d['old']}->{d['new']}: {d['reason']}"
              for d in r["decisions"]]
    if r["waiting_for_at_end"]:
        lines.append(f"waiting for at the end: {r['waiting_for_at_end']}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
