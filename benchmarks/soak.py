"""Months unattended, compressed: one fleet with everything that runs on this machine at
once, steady mixed traffic through the proxy, faults drawn from a seed, and the invariants
checked all along (docs/reliability.md, "The soak").

    .venv/bin/python benchmarks/soak.py --minutes 120 --seed 1 [--out soak-run1.json]
    [--each-first [--until-each]] [--result PATH]
    (tests/benchmarks/test_soak.py: every fault kind once, --until-each, at most 10 minutes)
    [--without kill_daemon] [--no-faults] [--trace-memory DIR]   (what grows in the daemon)

The fleet: `tuned` (ngram-mod, the tuner on) and `plain` (its own copy of the model, on a
"NAS" folder that faults take away) always run as child processes; `box` runs in a podman container
(where podman can run one here); `od-a`, `od-b`, `od-c` load on demand, and the declared
GPU memory (`daemon.gpu.memory`) holds only two of them at once, so they swap. The
status page's endpoints are polled as an open browser tab does, with a read key; the
clients send an inference key, read from its file for each request (`daemon.keys`). Faults
every 20-60 s (10-30 s while --each-first does each kind once, 5-15 s with --until-each): kill -9 and SIGSTOP of
runtimes, `podman kill`, kill -9 of the daemon and a
new one, SIGHUP with a changed file and with a broken one, API restarts, plain's NAS folder
moved away and back and its model truncated then whole again (each around a crash: the
target waits, then serves), the inference key rotated, the state dir full (a tmpfs, when
run as root).

Invariants, reported with counts: every request answered (200, or 502/503 with a reason;
cut streams counted apart); no runtime left over after each daemon kill and at the end;
the daemon's RSS, open files and threads flat (slope per hour); each target's state in
status.json is its last state event; tuning.json and the run records readable; every
fault recovered within its bound, and a target that waited for its file serving within its
bound of the file's return with no other target restarted. The exit status is 0 when all held. With `--systemd`
(root) a target `unit` runs with launcher: systemd under a real systemd manager
(tests/systemd_lab.py), and the daemon runs inside its namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import soak_checks as checks  # noqa: E402
from benchmarks.serverproc import cpu_model  # noqa: E402
from benchmarks.soak_faults import WEIGHTS, Faults  # noqa: E402
from benchmarks.soak_fleet import SoakFleet, poll_like_a_browser  # noqa: E402
from benchmarks.soak_traffic import Traffic  # noqa: E402
from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

TMPFS_MB = 64  # the state dir a fault fills: small, so that filling it is quick


def container_image(binary: str, work: Path) -> str | None:
    """tests/container_image.py's image of the cached llama-server, where podman runs."""
    if shutil.which("podman") is None:
        return None
    from tests.container_image import build_image, use_sandbox_conf
    use_sandbox_conf(work)
    try:
        return build_image(binary, work)
    except Exception as exc:  # no container target then: said in the result
        print(f"soak: no container target ({exc!r})", file=sys.stderr)
        return None


@contextlib.contextmanager
def small_state_dir(work: Path):
    """A tmpfs for the state dir (root only), which the state_dir_full fault fills."""
    path = work / "state-tmpfs"
    path.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(path)],
        capture_output=True, check=False).returncode == 0
    try:
        yield str(path) if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextlib.contextmanager
def systemd_lab(work: Path, wanted: bool):
    """A real systemd manager for the systemd target (started after the state dir's tmpfs
    is mounted, so that its namespace sees it), stopped at the very end."""
    if not wanted:
        yield None
        return
    from tests.systemd_lab import Lab
    lab = Lab(work / "sdlab")
    try:
        yield lab
    finally:
        lab.stop()


class Soak:
    def __init__(self, fleet: SoakFleet, args: argparse.Namespace) -> None:
        self.fleet, self.args = fleet, args
        self.traffic = Traffic("127.0.0.1", fleet.proxy_port,
                               fleet.always + ([fleet.container] if fleet.container else [])
                               + fleet.on_demand, args.clients, fleet.hold, args.seed, fleet.up,
                               key=lambda: fleet.key("inference"))
        self.faults = Faults(fleet, args.seed, each_first=args.each_first,
                             without=frozenset(args.without))
        self.records: list[dict[str, Any]] = []
        self.orphans: list[str] = []
        self.mismatches: list[str] = []
        self.poll_errors: list[str] = []
        self.resources = checks.DaemonResources()
        # The load's own draws: the faults' sequence stays the seed's whatever the timing.
        self.load_rand = random.Random(args.seed + 7919)

    def run(self) -> dict[str, Any]:
        fleet, rand = self.fleet, self.faults.rand
        fleet.start_daemon()
        stop = threading.Event()
        poller = threading.Thread(target=poll_like_a_browser,
                                  args=(fleet, stop, self.poll_errors), daemon=True)
        poller.start()
        self.traffic.start()
        end = time.monotonic() + self.args.minutes * 60
        low, high = self._pace()
        next_fault = time.monotonic() + rand.uniform(low, high)
        try:
            while time.monotonic() < end:
                if self.args.until_each and not self.faults.first and self.records:
                    break  # every kind done once (the traffic went on through each)
                self.traffic.active = self.load_rand.randint(1, self.args.clients)
                time.sleep(5)
                self._sample()
                if time.monotonic() >= next_fault and not self.args.no_faults:
                    fault, target = self.faults.next()
                    record = self.faults.run(fault, target)
                    self.records.append(record)
                    print(f"soak: {record['fault']} {record['target']}: recovered in "
                          f"{record['recovered_s']} s ({record['detail']})", file=sys.stderr)
                    self._check_orphans(after=fault)
                    low, high = self._pace()
                    next_fault = time.monotonic() + rand.uniform(low, high)
        except KeyboardInterrupt:
            # Ctrl-C: the daemon stops first (its runtimes and containers with it), before the
            # traffic's threads are waited for, which a second Ctrl-C would cut short.
            fleet.stop_daemon()
            raise
        finally:
            self.traffic.stop()
            stop.set()
            code = fleet.stop_daemon()
        self.mismatches += checks.status_matches_events(Path(fleet.state_dir))
        time.sleep(2)
        left = [f"pid {p}" for p in checks.runtimes_of(str(fleet.work))]
        left += checks.containers_of(fleet.state_dir, fleet.podman())  # none may be left
        if fleet.lab is not None:  # the systemd target's unit, stopped with the daemon
            state = fleet.lab.show("specfleet-unit.service", "ActiveState")
            left += [f"unit specfleet-unit.service {state}"] if state in ("active", "activating",
                                                                          "deactivating") else []
        return self.result(code, left)

    def _pace(self) -> tuple[float, float]:
        """Seconds between two faults, drawn uniformly. Every kind once first goes faster,
        so that a short run does them all (tests/benchmarks/test_soak.py); with --until-each
        faster still: the run then exists to do each once under traffic."""
        if not self.faults.first:
            return 20, 60
        return (5, 15) if self.args.until_each else (10, 30)

    def _sample(self) -> None:
        proc = self.fleet.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(RuntimeError):  # a daemon just killed
                self.resources.sample(self.fleet.daemon_pid(), time.time())

    def _check_orphans(self, after: str) -> None:
        """Runtimes no target owns, twice 15 s apart: an old server still draining after a
        restart beside, or one being stopped, is not listed in the status for a moment."""
        def unowned() -> set[str]:
            try:
                return set(checks.orphans(str(self.fleet.work), self.fleet.status()))
            except OSError:
                return set()
        first = unowned()
        if first:
            time.sleep(15)
            self.orphans += [f"after {after}: {o}" for o in sorted(first & unowned())]

    def result(self, exit_code: int, left: list[str]) -> dict[str, Any]:
        counts = dict(self.traffic.counts)
        late = [r for r in self.records if r["recovered_s"] is None]
        state = checks.state_files_readable(Path(self.fleet.state_dir))
        slopes = self.resources.slopes()
        rss = slopes.get("rss_mb_per_hour")
        summary = {
            "requests": sum(counts.values()), "outcomes": counts,
            "sent_again_with_a_rotated_key": self.traffic.rekeyed,
            "lost": counts.get("lost", 0), "orphans": len(self.orphans) + len(left),
            "faults": len(self.records), "not_recovered_in_bound": len(late),
            "status_event_mismatches": len(self.mismatches),
            "unreadable_state_files": len(state), "poll_errors": len(self.poll_errors),
            "daemon_exit": exit_code, "rss_mb_per_hour": rss,
            "open_files_per_hour": slopes.get("open_files_per_hour"),
            "threads_per_hour": slopes.get("threads_per_hour"),
        }
        summary["held"] = (summary["lost"] == 0 and summary["orphans"] == 0
                           and not late and not self.mismatches and not state
                           and exit_code == 0 and (rss is None or rss < 2.0))
        return {"summary": summary, "faults": self.records, "lost": self.traffic.lost[:50],
                "refused": self.traffic.refused[:50],
                "orphans": self.orphans + [f"at the end: {x}" for x in left],
                "mismatches": self.mismatches, "state_files": state,
                "poll_errors": self.poll_errors[:50], "resources": slopes,
                "rss_mb_by_daemon": self.resources.series(),
                "by_target": {t: dict(c) for t, c in self.traffic.by_target.items()},
                "container": self.fleet.container is not None,
                "systemd": self.fleet.lab is not None,
                "state_dir_full": self.fleet.full_dir is not None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clients", type=int, default=6, help="at most this many at once (6)")
    ap.add_argument("--out", default=None, help="a file name under benchmarks/results/")
    ap.add_argument("--result", default=None, help="write the result to this path instead")
    ap.add_argument("--each-first", action="store_true",
                    help="every fault kind once first, in an order drawn from the seed")
    ap.add_argument("--until-each", action="store_true",
                    help="with --each-first: end once every kind was done (--minutes bounds it)")
    ap.add_argument("--no-container", action="store_true")
    ap.add_argument("--systemd", action="store_true",
                    help="a target with launcher: systemd too; the daemon then runs inside a "
                         "real systemd manager's namespaces (tests/systemd_lab.py; root)")
    ap.add_argument("--without", action="append", default=[], choices=sorted(WEIGHTS),
                    metavar="FAULT", help="leave this kind of fault out (repeatable); "
                    "--without kill_daemon: one daemon life as long as the run")
    ap.add_argument("--no-faults", action="store_true",
                    help="traffic only: one daemon life as long as the run (for --trace-memory)")
    ap.add_argument("--trace-memory", default=None, metavar="DIR",
                    help="watch the daemon's memory from inside (benchmarks/traced_daemon.py): "
                         "allocator counters to DIR/<pid>.log every minute, and under "
                         "tracemalloc the sites that grew to DIR/<pid>.txt "
                         "(SPECFLEET_TRACE=light: the counters only, RSS as it is)")
    args = ap.parse_args()
    if args.until_each and not args.each_first:
        ap.error("--until-each needs --each-first")
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr)
    binary = str(provision.cached_llama_server() or provision.build_llama_server(
        progress=progress))
    model = str(assemble_example_model(progress=progress))
    with tempfile.TemporaryDirectory(prefix="specfleet-soak-") as tmp:
        work = Path(tmp)
        if args.systemd and not args.no_container:
            # podman cannot run inside the lab here: runc finds no pids controller in the
            # lab's cgroup subtree (this host's pids controller is on cgroup v1).
            print("soak: --systemd: no container target (podman does not run inside the "
                  "systemd lab on this machine)", file=sys.stderr)
        image = None if args.no_container or args.systemd else container_image(binary, work)
        with small_state_dir(work) as full_dir, systemd_lab(work, args.systemd) as lab:
            fleet = SoakFleet(work, binary, model, image, full_dir, lab)
            fleet.trace_memory = Path(args.trace_memory).resolve() if args.trace_memory else None
            result = Soak(fleet, args).run()
    result.update(cpu=cpu_model(), seed=args.seed, minutes=args.minutes,
                  command=" ".join(sys.argv))
    if args.out or args.result:
        path = Path(args.result) if args.result else REPO / "benchmarks" / "results" / args.out
        path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0 if result["summary"]["held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
