"""tuner_phases.py's accounting and report, pure: when a target was down (its restarts,
charged to the strategy that caused them), one strategy's tally of a phase, and the table of
tokens/s per phase against the best fixed setting (the oracle), the rule of thumb and
speculation off. A saved run's JSON can be re-read with it."""

from __future__ import annotations

from typing import Any


def down_intervals(events: list[dict[str, Any]], name: str, end: float) -> list[tuple[float,
                                                                                      float]]:
    """When the target had no ready server, after it first had one: (left ready, ready
    again). A restart beside runs two servers under one name for a while (the new one is
    ready before the old one leaves ready to drain), so the target is down only when the
    last ready one leaves, counted, not whenever one of them does."""
    out, left, ready, seen_ready = [], None, 0, False
    for e in events:
        if e.get("target") != name or e.get("kind") != "state":
            continue
        if e.get("new") == "ready":
            if left is not None:
                out.append((left, e["time"]))
            left, seen_ready, ready = None, True, ready + 1
        elif e.get("old") == "ready" and seen_ready:
            ready = max(0, ready - 1)
            if ready == 0:
                left = e["time"]
    if left is not None:
        out.append((left, end))
    return out


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as disjoint ones in order (concurrent requests overlap)."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def outside(intervals: list[tuple[float, float]], own: list[tuple[float, float]],
            start: float, end: float) -> float:
    """Seconds of `intervals`, clipped to [start, end], not covered by `own`."""
    own = merged(own)
    total = 0.0
    for a, b in intervals:
        a, b = max(a, start), min(b, end)
        if b <= a:
            continue
        covered = sum(max(0.0, min(b, y) - max(a, x)) for x, y in own)
        total += (b - a) - covered
    return total


class Tally:
    """One strategy's phase: tokens, draft counts, its request intervals (failed included)."""

    def __init__(self) -> None:
        self.tokens = self.draft = self.accepted = self.done = 0
        self.requests: list[tuple[float, float]] = []
        self.chunk = [0, 0]

    def add(self, timings: dict[str, Any]) -> None:
        self.done += 1
        self.tokens += int(timings.get("predicted_n", 0))
        for i, key in enumerate(("draft_n", "draft_n_accepted")):
            self.chunk[i] += int(timings.get(key, 0))
        self.draft += int(timings.get("draft_n", 0))
        self.accepted += int(timings.get("draft_n_accepted", 0))

    def take_chunk(self) -> float | None:
        drafted, accepted = self.chunk
        self.chunk = [0, 0]
        return accepted / drafted if drafted else None

    def result(self, down: list[tuple[float, float]], start: float, end: float) -> dict[str, Any]:
        # Wall time with a request of its own in flight: concurrent ones count once.
        own = sum(b - a for a, b in merged(self.requests))
        waited = outside(down, self.requests, start, end)
        seconds = own + waited
        return {"tokens": self.tokens, "seconds": round(seconds, 2),
                "restart_s": round(waited, 2), "tps": round(self.tokens / seconds, 2),
                "acceptance": round(self.accepted / self.draft, 3) if self.draft else None}


def total(rows: list[dict[str, Any]]) -> float:
    return sum(x["tokens"] for x in rows) / sum(x["seconds"] for x in rows)


def report(out: dict[str, Any]) -> str:
    lines = []
    for case, data in out["cases"].items():
        r, phases = data["results"], data["phases"]
        fixed = [name for name in r if name.startswith(("fixed-", "twin-"))]
        oracle = [max(fixed, key=lambda f, i=i: r[f][i]["tps"]) for i in range(len(phases))]
        lines.append(f"\n{case}: tokens/s per phase ({data['targets']} targets interleaved; "
                     "restarts charged)")
        lines.append("strategy         " + "".join(f"{p:>22}" for p in phases) + "     total")
        for name in r:
            cells = "".join(f"{x['tps']:>10.1f} (restart {x['restart_s']:>4.1f}s)"
                            for x in r[name])
            lines.append(f"{name:<16} {cells} {total(r[name]):>9.1f}")
        lines.append("oracle (best fixed per phase): " + ", ".join(
            f"{p} {o} {r[o][i]['tps']:.1f}" for i, (p, o) in enumerate(zip(phases, oracle,
                                                                          strict=True))))
        tuned = r["tuned"]
        per_phase = [tuned[i]["tps"] / r[o][i]["tps"] for i, o in enumerate(oracle)]
        oracle_total = (sum(r[o][i]["tokens"] for i, o in enumerate(oracle))
                        / sum(r[o][i]["seconds"] for i, o in enumerate(oracle)))
        lines.append("tuned / oracle per phase: " + ", ".join(f"{x:.2f}" for x in per_phase)
                     + "  (goal >= 0.95)")
        if "rule" in r:  # left out by --without rule
            lines.append(f"tuned / rule of thumb, whole run: {total(tuned) / total(r['rule']):.2f}"
                         "  (goal >= 1.10)")
            lines.append(f"oracle / rule of thumb, whole run: "
                         f"{oracle_total / total(r['rule']):.2f}  (the most any strategy could reach)")
        best_fixed = max(fixed, key=lambda f: total(r[f]))
        lines.append(f"tuned / the best fixed setting in hindsight ({best_fixed}), whole run: "
                     f"{total(tuned) / total(r[best_fixed]):.2f}  (goal >= 0.97)")
        lines.append(f"tuned / speculation off, whole run: "
                     f"{total(tuned) / total(r['fixed-off']):.2f}  (goal >= 1.00)")
        for twin in (f for f in r if f.startswith("twin-")):
            same = "fixed-" + twin[len("twin-"):]
            if same in r:
                lines.append(f"noise: {twin} / {same} (the same flags) per phase: " + ", ".join(
                    f"{a['tps'] / b['tps']:.2f}" for a, b in zip(r[twin], r[same], strict=True))
                    + f"; whole run {total(r[twin]) / total(r[same]):.2f}")
        if "fixed-16" in r and "fixed-3" in r:  # the guide's n-max 16, llama.cpp's default 3
            better = max(total(r["fixed-16"]), total(r["fixed-3"]))
            lines.append(f"tuned / the better of fixed-16 and fixed-3, whole run: "
                         f"{total(tuned) / better:.2f}  (goal >= 1.10)")
        off = r["fixed-off"]
        lines.append("tuned / speculation off per phase: " + ", ".join(
            f"{t['tps'] / o['tps']:.2f}" for t, o in zip(tuned, off, strict=True)))
        if "fixed-64" in r:
            lines.append("noise: defaults / fixed-64 (the same flags) per phase: " + ", ".join(
                f"{a['tps'] / b['tps']:.2f}" for a, b in zip(r["defaults"], r["fixed-64"],
                                                             strict=True)))
        if "calibration_s" in data:
            cal = data["calibration_s"]
            lines.append("calibration on the idle box before the warm-up: " + (
                f"{cal:.0f} s" if cal is not None else "not in after its wait"))
        warm = data.get("warmup", {})
        if "tuned" in warm:
            best = max((f for f in fixed if f in warm), key=lambda f: warm[f]["tps"])
            lines.append(f"warm-up ({warm['tuned']['tokens']} tokens each, not counted): tuned "
                         f"{warm['tuned']['tps']:.1f} tokens/s, best fixed {best} "
                         f"{warm[best]['tps']:.1f}")
        lines.append("tuning decisions: " + "; ".join(  # (not calibrations and checks)
            f"{e['action']} {e['old']}->{e['new']}" for e in data["tuning_events"]
            if e["action"] is not None))
    return "\n".join(lines)
