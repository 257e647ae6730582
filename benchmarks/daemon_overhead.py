"""What the daemon itself costs: CPU (% of one core) and RSS supervising 8 real llama-server
targets, idle and with proxy traffic, and the latency of `specfleet status`.

    .venv/bin/python benchmarks/daemon_overhead.py [--minutes 10] [--targets 8]
        [--old 350ff05] [--old-minutes 3] [--status-calls 20]

`specfleet run` supervises --targets llama-server targets (gemma-3-270m Q4_K_M, CPU,
`--ctx-size 512 --parallel 1 --threads 1`, n-gram speculation, tuning off) with
`health.metrics_interval: 1s`. Once all are ready (and 15 s more, for the launch's
run-record digests), the daemon's own CPU time (user + system, psutil; its children's not
counted) over the wall-clock time of each phase is its share of one core, and its RSS is
sampled every 5 s:

  idle      --minutes of supervision alone: health probes, a metrics read per target per
            second, the status file, the resource monitor
  traffic   --minutes with one client sending small completions (8 tokens) through the
            proxy, one after another, to each target in turn (requests/s reported)

`specfleet status FILE` and `status --state-dir DIR` are then timed (--status-calls each,
median) against the running daemon, alternating with the same commands of the --old commit
(a `git worktree` of it, same interpreter and state dir), so that old/new is a ratio from
one run. With --old-minutes, the old commit's daemon is also measured idle on the same
fleet (its own fresh state dir, as the new one has). Goal (issue 14): < 0.5 % of a core
and < 80 MB RSS supervising 8 targets; `specfleet status` under 0.3 s.

Nothing survives the script: each daemon is stopped with SIGTERM (then its process group
is killed), the worktree is removed, and the script fails if a llama-server it started is
still running. Writes benchmarks/results/daemon_overhead.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
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

from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from daemon_overhead_report import report  # noqa: E402
from serverproc import free_port  # noqa: E402

OTHERS = ("pytest", "vllm.entrypoints", "specfleet bench")  # other people's load on the host


def fleet_file(work: Path, binary: Path, model: Path, n: int, interval: str) -> tuple[Path, int]:
    work.mkdir(parents=True, exist_ok=True)
    proxy = free_port()
    targets = {f"t{i}": {"model": str(model), "binary": str(binary), "port": free_port(),
                         "args": ["--ctx-size", "512", "--parallel", "1", "--threads", "1"],
                         "speculation": {"method": "ngram"},
                         "health": {"metrics_interval": interval},
                         "tuning": {"enabled": False}} for i in range(n)}
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1,
        "daemon": {"state_dir": str(work / "state"), "api": f"127.0.0.1:{free_port()}",
                   "proxy": {"listen": f"127.0.0.1:{proxy}"}},
        "targets": targets}))
    return path, proxy


class Daemon:
    """`specfleet run` of the code in `tree` (this checkout or the old worktree)."""

    def __init__(self, tree: Path, fleet: Path) -> None:
        self.fleet = fleet
        self.state = fleet.parent / "state"
        self.log = (fleet.parent / "daemon.log").open("wb")
        # cwd first on sys.path: `-m supervisor` runs the tree's code, plugins included.
        self.proc = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet),
                                      "--json-logs"], cwd=tree, stdout=subprocess.DEVNULL,
                                     stderr=self.log, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)

    def targets(self) -> list[dict[str, Any]]:
        try:
            return json.loads((self.state / "status.json").read_text())["targets"]
        except (OSError, ValueError, KeyError):
            return []

    def wait_ready(self, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"specfleet exited with {self.proc.returncode}: "
                                 f"{(self.fleet.parent / 'daemon.log').read_text()[-2000:]}")
            states = [t["state"] for t in self.targets()]
            if len(states) == n and all(s == "ready" for s in states):
                return
            time.sleep(0.5)
        raise SystemExit(f"targets not ready after {timeout:.0f} s: {self.targets()}")

    def measure(self, seconds: float, sample_every: float = 5.0) -> dict[str, Any]:
        """CPU share of one core and RSS over `seconds` of wall-clock time."""
        rss: list[int] = []
        others: set[str] = set()
        t0, c0 = time.monotonic(), self.ps.cpu_times()
        while (left := t0 + seconds - time.monotonic()) > 0:
            rss.append(self.ps.memory_info().rss)
            others.update(others_running())
            time.sleep(min(sample_every, left))
        c1, wall = self.ps.cpu_times(), time.monotonic() - t0
        rss.append(self.ps.memory_info().rss)
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        return {"seconds": round(wall, 1), "cpu_seconds": round(cpu, 3),
                "cpu_percent_of_core": round(100 * cpu / wall, 3),
                "user_seconds": round(c1.user - c0.user, 3),
                "system_seconds": round(c1.system - c0.system, 3),
                "rss_mb_mean": round(statistics.mean(rss) / 2**20, 1),
                "rss_mb_max": round(max(rss) / 2**20, 1), "threads": self.ps.num_threads(),
                "others_running": sorted(others)}

    def stop(self) -> list[int]:
        """SIGTERM, then the process group; the pids of its runtimes still alive after it
        (killed here: a benchmark leaves nothing behind)."""
        runtimes = []
        with contextlib.suppress(psutil.Error):
            runtimes = self.ps.children(recursive=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        alive = [p for p in runtimes if p.is_running()
                 and p.status() != psutil.STATUS_ZOMBIE]
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        return [p.pid for p in alive]


class Traffic(threading.Thread):
    """One client: small completions through the proxy, one target after the other."""

    def __init__(self, proxy: int, names: list[str], max_tokens: int = 8) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{proxy}/v1/completions"
        self.names, self.max_tokens = names, max_tokens
        self.stop_flag = threading.Event()
        self.ok = self.failed = 0

    def run(self) -> None:
        i = 0
        while not self.stop_flag.is_set():
            body = json.dumps({"model": self.names[i % len(self.names)], "max_tokens":
                               self.max_tokens, "temperature": 0, "prompt":
                               f"def add_{i}(a, b):\n    return a + b\n\ndef add_{i}(a, b):\n"})
            try:
                req = urllib.request.Request(self.url, body.encode(),
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as resp:
                    resp.read()
                self.ok += 1
            except (urllib.error.URLError, OSError):
                self.failed += 1
                time.sleep(0.5)
            i += 1


def time_status(variants: dict[str, tuple[Path, list[str]]], calls: int) -> dict[str, Any]:
    """Median wall time of each status command, the variants alternating call by call."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(2):  # warm-up: page cache, .pyc files
        for tree, argv in variants.values():
            subprocess.run([sys.executable, "-m", "supervisor", *argv], cwd=tree,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    for _ in range(calls):
        for name, (tree, argv) in variants.items():
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "supervisor", *argv], cwd=tree,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  check=False)
            times[name].append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"status ({name}) failed: {done.stderr.decode()[-500:]}")
    return {k: {"median_s": round(statistics.median(v), 4), "min_s": round(min(v), 4),
                "max_s": round(max(v), 4)} for k, v in times.items()}


def others_running() -> list[str]:
    me = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] not in me and any(o in line for o in OTHERS):
            found.append(line[:120])
    return found


def leftovers(work: Path) -> list[int]:
    """Daemons of this benchmark still running (their fleet files are under `work`)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if str(work) in " ".join(p.info["cmdline"] or []) and p.info["pid"] != os.getpid():
                out.append(p.info["pid"])
    return out


def run_phases(args: argparse.Namespace, work: Path, binary: Path, model: Path) -> dict[str, Any]:
    old_tree = work / "old-tree" if args.old else None
    if old_tree is not None:
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.old],
                       cwd=REPO, check=True, capture_output=True)
    try:
        result = measure_new(args, work, binary, model, old_tree)
        if old_tree is not None and args.old_minutes > 0:
            result |= measure_old(args, work, binary, model, old_tree)
        return result
    finally:
        if old_tree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=REPO,
                           check=False, capture_output=True)


def measure_new(args: argparse.Namespace, work: Path, binary: Path, model: Path,
                old_tree: Path | None) -> dict[str, Any]:
    fleet, proxy = fleet_file(work / "new", binary, model, args.targets, args.metrics_interval)
    daemon = Daemon(REPO, fleet)
    result: dict[str, Any] = {}
    try:
        daemon.wait_ready(args.targets)
        time.sleep(15)  # the launch's run-record digests, then steady state
        result["ready_rss_mb"] = round(daemon.ps.memory_info().rss / 2**20, 1)
        print(f"idle phase: {args.minutes} min", file=sys.stderr)
        result["idle"] = daemon.measure(60 * args.minutes)
        traffic = Traffic(proxy, [f"t{i}" for i in range(args.targets)])
        print(f"traffic phase: {args.minutes} min", file=sys.stderr)
        traffic.start()
        result["traffic"] = daemon.measure(60 * args.minutes)
        traffic.stop_flag.set()
        traffic.join(90)
        result["traffic"].update(requests=traffic.ok, failed=traffic.failed, requests_per_s=round(
            traffic.ok / result["traffic"]["seconds"], 2))
        variants = {"new FILE": (REPO, ["status", str(fleet)]),
                    "new --state-dir": (REPO, ["status", "--state-dir", str(daemon.state)])}
        if old_tree is not None:
            variants |= {"old FILE": (old_tree, ["status", str(fleet)]),
                         "old --state-dir": (old_tree, ["status", "--state-dir",
                                                        str(daemon.state)])}
        print(f"status latency: {args.status_calls} calls each", file=sys.stderr)
        result["status"] = time_status(variants, args.status_calls)
    finally:
        result["left_running"] = daemon.stop()
    return result


def measure_old(args: argparse.Namespace, work: Path, binary: Path, model: Path,
                old_tree: Path) -> dict[str, Any]:
    """The old commit's daemon, idle, on the same fleet with a fresh state dir of its own."""
    fleet, _ = fleet_file(work / "old", binary, model, args.targets, args.metrics_interval)
    old = Daemon(old_tree, fleet)
    result: dict[str, Any] = {}
    try:
        old.wait_ready(args.targets)
        time.sleep(15)
        result["old_ready_rss_mb"] = round(old.ps.memory_info().rss / 2**20, 1)
        print(f"old daemon ({args.old}), idle: {args.old_minutes} min", file=sys.stderr)
        result["old_idle"] = old.measure(60 * args.old_minutes)
    finally:
        result["old_left_running"] = old.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0, help="per phase (10)")
    parser.add_argument("--metrics-interval", default="1s")
    parser.add_argument("--status-calls", type=int, default=20)
    parser.add_argument("--old", default="350ff05",
                        help="commit to compare with (the code before issue 14's part 5); "
                        "'' for none")
    parser.add_argument("--old-minutes", type=float, default=3.0,
                        help="idle minutes of the old commit's daemon (0: not run)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" /
                                             "daemon_overhead.json"))
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (fleet files, state dirs, daemon logs)")
    args = parser.parse_args()
    binary = provision.cached_llama_server() or provision.build_llama_server()
    model = assemble_example_model(lambda msg: print(msg, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="specfleet-daemon-bench-"))
    before = others_running()
    load_before = os.getloadavg()
    try:
        result = run_phases(args, work, binary, model)
    finally:
        time.sleep(2)
        left = leftovers(work)
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    left += result["left_running"] + result.get("old_left_running", [])
    if left:
        raise SystemExit(f"processes of the benchmark were still running (killed): {left}")
    after = others_running()
    result.update(date=time.strftime("%Y-%m-%d %H:%M"), cpus=os.cpu_count(),
                  targets=args.targets, minutes=args.minutes, old=args.old,
                  metrics_interval=args.metrics_interval,
                  others=sorted({*before, *after, *result["idle"]["others_running"],
                                 *result["traffic"]["others_running"]}),
                  load_average_before=[round(x, 2) for x in load_before],
                  load_average_after=[round(x, 2) for x in os.getloadavg()])
    result["shared"] = bool(result["others"])
    Path(args.out).write_text(json.dumps(result, indent=1))
    report(result, args)
    print(f"written: {args.out}")
    if args.keep:
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
