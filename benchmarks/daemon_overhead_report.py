"""daemon_overhead.py's report: the daemon's CPU and memory per phase, `specfleet status`
times against the old commit's, and the goals. Pure: it prints a recorded result."""

from __future__ import annotations

import argparse
import os
from typing import Any


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nspecfleet daemon, {args.targets} llama-server targets, metrics every "
          f"{args.metrics_interval}; {os.cpu_count()} CPUs; others running: "
          f"{'yes' if r['shared'] else 'no'}")
    print(f"{'phase':22s} {'CPU % of a core':>16s} {'RSS MB mean':>12s} {'RSS MB max':>11s}")
    rows = [("idle", r["idle"]), ("traffic", r["traffic"])]
    if "old_idle" in r:
        rows.append((f"idle, old ({args.old})", r["old_idle"]))
    for name, m in rows:
        print(f"{name:22s} {m['cpu_percent_of_core']:16.3f} {m['rss_mb_mean']:12.1f} "
              f"{m['rss_mb_max']:11.1f}")
    print(f"traffic: {r['traffic']['requests_per_s']} requests/s through the proxy "
          f"({r['traffic']['failed']} failed)")
    print(f"\n{'specfleet status':22s} {'median s':>9s} {'min s':>7s}")
    for name, s in r["status"].items():
        print(f"{name:22s} {s['median_s']:9.3f} {s['min_s']:7.3f}")
    for kind in ("FILE", "--state-dir"):
        if f"old {kind}" in r["status"]:
            ratio = r["status"][f"new {kind}"]["median_s"] / r["status"][f"old {kind}"]["median_s"]
            print(f"status {kind}: new / old = {ratio:.2f}")
    idle, worst = r["idle"], max(r["idle"]["rss_mb_max"], r["traffic"]["rss_mb_max"])
    status = r["status"]["new FILE"]["median_s"]
    print(f"\ngoals: CPU {idle['cpu_percent_of_core']:.2f} % < 0.5 % "
          f"{'met' if idle['cpu_percent_of_core'] < 0.5 else 'missed'}; RSS {worst:.1f} MB "
          f"< 80 MB {'met' if worst < 80 else 'missed'}; status {status:.3f} s < 0.3 s "
          f"{'met' if status < 0.3 else 'missed'}")
