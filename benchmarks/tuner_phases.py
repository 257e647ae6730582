"""Benchmark: does the tuner beat fixed settings when the workload drifts, live?

A phased workload (repetitive code at temperature 0, free prose at 0.8, code again, prose
again: classes that come back) is served under several strategies, all in one `specfleet
run` daemon on the real llama-server, one target per strategy:

  tuned      specfleet's tuner (it calibrates beside its server first, where it can)
  fixed-X    one fixed setting each (off and the lengths that can be best): the sweep;
             the best of them per phase is the oracle, the best over the whole run the
             best fixed setting in hindsight
  twin-X     the sweep's longest setting again: the same flags twice show the noise
  defaults   the runtime's own defaults; rule: an operator's script (start at 16, double
             while acceptance per chunk of 8 requests is above 70 %, halve below 40 %, by
             fleet-file edit and SIGHUP); both left out unless `--without ''`

Interleaved, not one strategy after another: the client sends request i of a phase to
every target in turn (the order rotating each round) before request i+1, so every strategy
sees the same machine at the same moments (measured one after another, the same setting
differed by up to 40 % between rows minutes apart on this 2-core machine). Every request
is a new text (Workload.prompt).

Requests go through specfleet's proxy (the path a router uses): a restart drains the
request in flight, and requests wait while a target restarts. Each strategy is charged the
wall time of its own requests plus the time its target was not ready (from the daemon's
state events) outside those requests: what a lone client of that target would have waited.

The tuned target calibrates first on an idle box (no traffic until its calibration is in,
at most 20 minutes: what a box just installed gives it; beside interleaved traffic it would
wait for quiet that never comes). Then every target gets the same warm-up on the first
phase's workload, reported apart and not counted in the phases, until the tuner has its
calibration (or, without one, its first decision), at most 96 requests. Cases: ngram-mod,
self-draft (the draft is the target's own GGUF: speculation can only hurt), pair
(`specfleet setup --pair`).

Run: .venv/bin/python benchmarks/tuner_phases.py [--requests 20] [--max-tokens 192] [--cases
pair] (the pair: 4 phases x 20 requests of 192 tokens per target; a prose request at a
fixed n=16 takes about 80 s, so each target at n=16 adds about 55 minutes: run 20 with
4 targets, two of them at n=16, ran 130 minutes on 2 cores; `--sweep 16,off` makes the twin
an off one); writes benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugins.llamacpp import provision  # noqa: E402
from supervisor.bench.workloads import BUILT_IN  # noqa: E402
from supervisor.plugin import assemble_example_model, assemble_pair, pair_paths  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from serverproc import cpu_model, free_port, http  # noqa: E402
from tuner_report import Tally, down_intervals, report  # noqa: E402

# Classes that come back: the tuner must give a class seen before its setting at once.
PHASES = ["code", "prose", "code", "prose"]
# None: speculation off; (variant, length): another n-gram variant.
# (n-max 8 was never the best in runs 1-6: left out, one target fewer to interleave.)
SWEEPS: dict[str, list[Any]] = {"ngram-mod": [None, 16, 32, 64],
                                "self-draft": [None, 2, 4, 16],
                                # The guide's n-max 16 and llama.cpp's default 3 among them.
                                "pair": [None, 4, 8, 16]}
# What the tuner may search besides the length, per case.
TUNED_EXTRA: dict[str, dict[str, Any]] = {"ngram-mod": {}, "self-draft": {}, "pair": {}}
BENCH_TUNING = {"enabled": True, "min_tokens": 400, "min_steps": 40, "max_wait": "5s"}
CHUNK = 8  # the rule of thumb's chunk of requests
WARMUP_MAX = 96  # requests per target at most before the measured phases
CALIBRATION_MAX = 1200.0  # seconds the idle box waits for the tuned target's calibration
KEPT_DATA = ("predicted", "mix", "remaining_busy_s", "switch_cost_s", "expected_gain",
             "waited_s")


def spec_with(base: dict[str, Any], length: Any) -> dict[str, Any]:
    if length is None:
        return {"method": "none"}
    if isinstance(length, tuple):  # (variant, length)
        base, length = {**base, "variant": length[0]}, length[1]
    return {**base, "length": {"start": length, "min": 2, "max": 64}}


def setting_name(length: Any) -> str:
    return "off" if length is None else f"{length[0]}-{length[1]}" if isinstance(
        length, tuple) else str(length)


class Fleet:
    """`specfleet run` on a fleet file with one target per strategy; the rule's changes
    rewrite the file and send SIGHUP."""

    def __init__(self, workdir: Path, targets: dict[str, dict[str, Any]]) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fleet = self.dir / "fleet.yaml"
        self.targets = targets
        self.proxy = f"127.0.0.1:{free_port()}"
        self.api = f"127.0.0.1:{free_port()}"
        self._write()
        self.err = (self.dir / "daemon.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(self.fleet)],
                                     cwd=REPO, stderr=self.err, stdout=subprocess.DEVNULL)
        for name in targets:
            self.wait_ready(name, timeout=300)

    def _write(self) -> None:
        self.fleet.write_text(yaml.safe_dump({
            "version": 1, "daemon": {"state_dir": str(self.dir / "state"), "api": self.api,
                                     "proxy": {"listen": self.proxy, "hold": "5m"}},
            "targets": self.targets}))

    def status(self, name: str) -> dict[str, Any]:
        try:
            doc = json.loads((self.dir / "state" / "status.json").read_text())
        except (OSError, ValueError):
            return {}
        return next((t for t in doc.get("targets", []) if t.get("name") == name), {})

    def wait_ready(self, name: str, not_pid: int | None = None,
                   timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"specfleet exited with {self.proc.returncode}:\n"
                                   + (self.dir / "daemon.log").read_text()[-3000:])
            t = self.status(name)
            if t.get("state") == "ready" and t.get("pid") != not_pid:
                return t
            time.sleep(0.1)
        raise RuntimeError(f"target {name} not ready: {self.status(name)}")

    def set_speculation(self, name: str, speculation: dict[str, Any]) -> None:
        pid = self.status(name).get("pid")
        self.targets = {**self.targets, name: {**self.targets[name], "speculation": speculation}}
        self._write()
        self.proc.send_signal(signal.SIGHUP)
        self.wait_ready(name, not_pid=pid)

    def events(self) -> list[dict[str, Any]]:
        path = self.dir / "state" / "events.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []

    def complete(self, name: str, prompt: str, max_tokens: int,
                 sampling: dict[str, Any]) -> dict[str, Any] | None:
        """One completion through the proxy; llama-server's `timings`, None if it failed."""
        status, body = http(f"http://{self.proxy}/v1/completions",
                            {"model": name, "prompt": prompt, "max_tokens": max_tokens,
                             "cache_prompt": False, **sampling}, timeout=600)
        try:
            return json.loads(body)["timings"] if status == 200 else None
        except (ValueError, KeyError):
            return None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        self.err.close()


class Rule:
    """The operators' rule of thumb for one target, driven per chunk of its requests."""

    def __init__(self, fleet: Fleet, base_spec: dict[str, Any]) -> None:
        self.fleet, self.base, self.k = fleet, base_spec, 16

    def after_chunk(self, acceptance: float | None) -> None:
        if acceptance is None:
            return
        k = self.k
        new = min(64, k * 2) if acceptance > 0.7 else max(2, k // 2) if acceptance < 0.4 else k
        if new != k:
            self.k = new
            self.fleet.set_speculation("rule", spec_with(self.base, new))


def run_phase(fleet: Fleet, names: list[str], phase: str, n: int, max_tokens: int,
              rule: Rule, until=None, first: int = 0) -> dict[str, Tally]:
    """n requests per target, interleaved; `until()` true ends it early. `phase`: a
    workload, `code*4`: with 4 concurrent clients (a target's turn sends 4 at once). Request
    j of a target gets the workload's prompt `first + j` (a new text for every request:
    Workload.prompt), the same for every target."""
    workload, _, clients = phase.partition("*")
    w, c = BUILT_IN[workload], int(clients or 1)
    tallies = {name: Tally() for name in names}

    def one(name: str, j: int) -> tuple[float, float, dict[str, Any] | None]:
        started = time.time()
        timings = fleet.complete(name, w.prompt(first + j), max_tokens, w.sampling)
        return started, time.time(), timings

    i = 0
    with ThreadPoolExecutor(c) as pool:
        while any(t.done < n for t in tallies.values()) and not (until and until()):
            order = names[i % len(names):] + names[:i % len(names)]
            i += 1
            for name in order:
                tally = tallies[name]
                batch = range(tally.done, min(n, tally.done + c))
                for started, ended, timings in pool.map(lambda j, m=name: one(m, j), batch):
                    tally.requests.append((started, ended))
                    if timings is not None:
                        tally.add(timings)
                if name == "rule" and batch and tally.done % CHUNK == 0:
                    rule.after_chunk(tally.take_chunk())
    return tallies


def warmed_up(fleet: Fleet) -> bool:
    """The tuner has what it needs before its first decision: a calibration where the
    runtime can make one (once per model files and build in a target's life), else any
    decision (n-gram: the cost is learnt from serving)."""
    view = fleet.status("tuned").get("tuning", {})
    if view.get("needs_calibration"):
        return False
    return bool(view.get("calibration")) or view.get("last_decision") is not None


def tuning_event(e: dict[str, Any]) -> dict[str, Any]:
    """A tuning event as the results keep it (events.jsonl leaves out an empty `data`)."""
    data = e.get("data") or {}
    return {"time": e["time"], "reason": e["reason"], "action": data.get("action"),
            "old": data.get("old"), "new": data.get("new"),
            # The numbers behind it, for reading a surprising decision.
            "data": {k: data[k] for k in KEPT_DATA if k in data}}


def wait_calibrated(fleet: Fleet, timeout: float = CALIBRATION_MAX) -> float | None:
    """Seconds until the tuned target's calibration is in (or its tuner decides without
    one); None if that took longer than `timeout` (the warm-up's traffic follows anyway)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not fleet.status("tuned").get("tuning", {}).get("needs_calibration", True):
            return round(time.monotonic() - start, 1)
        time.sleep(1)
    return None


def run_case(root: Path, base_target: dict[str, Any], spec: dict[str, Any], phases: list[str],
             sweep: list[Any], extra: dict[str, Any], n: int, max_tokens: int,
             without: frozenset[str] = frozenset()) -> dict[str, Any]:
    fixed = {f"fixed-{setting_name(s)}": spec_with(spec, s) for s in sweep}
    # The same flags twice (the sweep's longest, `twin-`): how far two identical targets
    # differ is the noise every ratio below carries.
    twin = sweep[-1]
    specs = {"defaults": spec, "rule": spec_with(spec, 16),
             "tuned": {**spec_with(spec, 16), **extra}, **fixed,
             f"twin-{setting_name(twin)}": spec_with(spec, twin)}
    specs = {name: s for name, s in specs.items() if name not in without}
    k = len(specs)
    tuning = dict(BENCH_TUNING)
    targets = {name: {**base_target, "port": free_port(), "speculation": s,
                      **({"tuning": tuning} if name == "tuned" else {})}
               for name, s in specs.items()}
    fleet = Fleet(root, targets)
    names = list(targets)
    try:
        rule = Rule(fleet, spec)
        # The calibration first, on an idle box, as a box that was just installed gives it
        # (once per model files and build; beside a busy fleet it waits for quiet that
        # interleaved traffic never leaves): timed, reported apart, charged to nobody.
        calibration_s = wait_calibrated(fleet)
        # Then a warm-up on the first phase's workload, reported apart, until the tuner has
        # what it needs before a decision (at once where the calibration came).
        start = time.time()
        warm = run_phase(fleet, names, phases[0], WARMUP_MAX, max_tokens, rule,
                         until=lambda: warmed_up(fleet))
        warm_window = (start, time.time())
        windows, tallies = [], []
        for j, p in enumerate(phases, 1):  # the warm-up had prompts 0..WARMUP_MAX-1
            start = time.time()
            tallies.append(run_phase(fleet, names, p, n, max_tokens, rule,
                                     first=j * max(WARMUP_MAX, n)))
            windows.append((start, time.time()))
        events = fleet.events()
    finally:
        fleet.stop()
    results: dict[str, list[dict[str, Any]]] = {}
    warmup: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = []
        for (start, end), phase_tallies in zip(windows, tallies, strict=True):
            down = down_intervals(events, name, end)
            results[name].append(phase_tallies[name].result(down, start, end))
        if warm[name].tokens:
            warmup[name] = warm[name].result(down_intervals(events, name, warm_window[1]),
                                             *warm_window)
    return {"results": results, "warmup": warmup, "targets": k, "tuning": tuning,
            "calibration_s": calibration_s,
            "tuning_events": [tuning_event(e) for e in events if e["kind"] == "tuning"
                              and e.get("target") == "tuned"],
            "phase_windows": windows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20, help="requests per phase (20)")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--cases", default="ngram-mod,self-draft",
                    help="ngram-mod, self-draft, pair (the F32 target of `specfleet setup "
                    "--pair` drafted for by the Q4_K_M)")
    ap.add_argument("--without", default="defaults,rule", help="strategies left out "
                    "(defaults,rule: the runtime's defaults and the rule of thumb; give '' to "
                    "run them too)")
    ap.add_argument("--sweep", help="the fixed settings instead of the case's own, e.g. "
                    "'off,16' (off and the lengths that can be best on its phases); the "
                    "last one gets the twin")
    ap.add_argument("--out", default="tuner_phases.json", help="a file name under results/")
    args = ap.parse_args()
    binary = str(provision.cached_llama_server() or provision.build_llama_server())
    model = str(assemble_example_model(lambda msg: print(msg, file=sys.stderr)))
    base_target = {"model": model, "binary": binary, "args": ["--ctx-size", "4096"],
                   "tuning": {"enabled": False},
                   "health": {"interval": "1s", "metrics_interval": "1s"},
                   # A planned restart drains the request in flight first (the proxy holds
                   # new ones); then llama-server exits on SIGTERM at once.
                   "restart": {"stop_grace": "30s"}}
    n, mt = args.requests, args.max_tokens
    sweep = [None if x == "off" else int(x) for x in args.sweep.split(",")] \
        if args.sweep else None
    out: dict[str, Any] = {"requests_per_phase": n, "max_tokens": mt, "phases": PHASES,
                           "machine": f"{os.cpu_count()} CPUs, {cpu_model()}", "interleaved": True,
                           "cases": {}}
    cases = {
        "ngram-mod": ({"method": "ngram", "variant": "mod"}, PHASES),
        "self-draft": ({"method": "draft", "draft": model}, ["code"]),
    }
    if "pair" in args.cases.split(","):
        pair = assemble_pair(lambda msg: print(msg, file=sys.stderr))
        # The Q4_K_M drafting for the F32 target: 1.2-1.7x at temperature 0 with the best
        # length moving between code and prose, 0.2-0.3x on prose at 0.8 (pair_files.py).
        cases["pair"] = ({"method": "draft", "draft": str(pair["close_draft"])},
                         PHASES)
    with tempfile.TemporaryDirectory(prefix="specfleet-bench-") as tmp:
        for case, (spec, phases) in cases.items():
            if case not in args.cases.split(","):
                continue
            print(f"== {case}", file=sys.stderr, flush=True)
            base = {**base_target, "model": str(pair_paths()["target"])} if case == "pair" \
                else base_target
            out["cases"][case] = run_case(Path(tmp) / case, base, spec, phases,
                                          sweep or SWEEPS[case], TUNED_EXTRA[case], n, mt,
                                          frozenset(filter(None, args.without.split(","))))
            out["cases"][case]["phases"] = phases
            print(report({"cases": {case: out["cases"][case]}}), file=sys.stderr, flush=True)
    print(report(out))
    results_dir = REPO / "benchmarks" / "results"
    results_dir.mkdir(exist_ok=True)
    (results_dir / Path(args.out).name).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
