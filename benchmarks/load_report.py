"""load_phases.py's analysis and table: each setting's tokens/s against speculation off in
the same phase, the best setting per phase (does the optimum move with the load?), and the
noise of the run. Pure: it reads the recorded results, so a saved run can be re-read."""

from __future__ import annotations

import statistics
from typing import Any

CLIENTS = 8  # the busy phase's clients, as phase_measure.py has them


def analyse(runtime: str, settings: dict[str, Any], workload: str) -> dict[str, Any] | None:
    """Ratios vs off per phase, the oracle per phase, whether it moves, and the noise."""
    ok = {n: r[workload] for n, r in settings.items() if "error" not in r and workload in r}
    if "off" not in ok:
        return None
    phases = [str(c) for c in (1, CLIENTS)]
    ranked = {n: r for n, r in ok.items() if n != "off#2"}
    best = {p: max(ranked, key=lambda n, p=p: ranked[n][p]["tps"]) for p in phases}
    res: dict[str, Any] = {
        "ratio_vs_off": {n: {p: round(r[p]["tps"] / ok["off"][p]["tps"], 3) for p in phases}
                         for n, r in ok.items()},
        "oracle": best,
        "moves": best["1"] != best[str(CLIENTS)],
        # What the 1-client optimum gives at 8 clients / the 8-client optimum, and back.
        "best1_at_8_vs_best8": round(ranked[best["1"]][str(CLIENTS)]["tps"]
                                     / ranked[best[str(CLIENTS)]][str(CLIENTS)]["tps"], 3),
        "best8_at_1_vs_best1": round(ranked[best[str(CLIENTS)]]["1"]["tps"]
                                     / ranked[best["1"]]["1"]["tps"], 3),
    }
    noise: dict[str, Any] = {}
    for p in phases:
        per_req = ok["off"][p]["per_request_tps"]
        noise[p] = {"per_request_cv": round(statistics.pstdev(per_req) / statistics.mean(per_req),
                                            3)}
        if "off#2" in ok:
            a, b = ok["off"][p]["tps"], ok["off#2"][p]["tps"]
            noise[p]["off_repeat_ratio"] = round(b / a, 3)
            noise[p]["off_spread"] = round(abs(a - b) / ((a + b) / 2), 3)
        spreads = {n: (max(r[p]["tps_rounds"]) - min(r[p]["tps_rounds"])) / r[p]["tps"]
                   for n, r in ranked.items() if len(r[p]["tps_rounds"]) > 1}
        if spreads:  # the range of tokens/s over the rounds, relative to their median
            noise[p]["off_rounds_spread"] = round(spreads.get("off", float("nan")), 3)
            noise[p]["median_rounds_spread"] = round(statistics.median(spreads.values()), 3)
            noise[p]["max_rounds_spread"] = round(max(spreads.values()), 3)
    res["noise"] = noise
    return res


def print_table(runtime: str, settings: dict[str, Any], workload: str,
                a: dict[str, Any]) -> list[str]:
    lines = [f"{runtime} / {workload}: aggregate tokens/s per phase (ratio vs off in the "
             "same phase), request latency p50/p95 s, acceptance, draft tokens per draft, "
             "cores used by other processes during the phase (worst round)",
             f"{'setting':<11}{'phase':>6}{'tok/s':>8}{'/off':>7}{'p50':>7}{'p95':>7}"
             f"{'accept':>8}{'d/draft':>8}{'others':>7}  rounds"]
    for name, rec in settings.items():
        if "error" in rec:
            lines.append(f"{name:<11}  FAILED: {rec['error'].splitlines()[0][:100]}")
            continue
        if workload not in rec:
            continue
        for p in ("1", str(CLIENTS)):
            r = rec[workload][p]
            acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
            dpd = f"{r['draft_per_draft']:.2f}" if r["draft_per_draft"] is not None else "-"
            lines.append(f"{name if p == '1' else '':<11}{p + 'c':>6}{r['tps']:>8.1f}"
                         f"{a['ratio_vs_off'][name][p]:>7.2f}{r['p50_s']:>7.2f}"
                         f"{r['p95_s']:>7.2f}{acc:>8}{dpd:>8}{r['others_cores']:>7.2f}  "
                         + (" ".join(f"{x:.0f}" for x in r["tps_rounds"])
                            if len(r["tps_rounds"]) > 1 else ""))
    b1, b8 = a["oracle"]["1"], a["oracle"][str(CLIENTS)]
    lines.append(f"oracle: 1 client -> {b1} ({a['ratio_vs_off'][b1]['1']:.2f}x off), "
                 f"{CLIENTS} clients -> {b8} ({a['ratio_vs_off'][b8][str(CLIENTS)]:.2f}x off)")
    lines.append(f"optimum {'MOVES' if a['moves'] else 'does not move'}: the 1-client optimum "
                 f"at {CLIENTS} clients gives {a['best1_at_8_vs_best8']:.3f}x the "
                 f"{CLIENTS}-client optimum; the {CLIENTS}-client optimum at 1 client gives "
                 f"{a['best8_at_1_vs_best1']:.3f}x the 1-client optimum")
    for p, n in a["noise"].items():
        extra = (f", off repeated last: {n['off_repeat_ratio']:.3f}x the first "
                 f"(spread {100 * n['off_spread']:.1f} %)" if "off_repeat_ratio" in n else "")
        if "median_rounds_spread" in n:
            extra += (f", range over rounds / median: off {100 * n['off_rounds_spread']:.1f} %, "
                      f"median setting {100 * n['median_rounds_spread']:.1f} %, largest "
                      f"{100 * n['max_rounds_spread']:.1f} %")
        lines.append(f"noise {p}c: per-request tokens/s CV {100 * n['per_request_cv']:.1f} %"
                     + extra)
    return lines
