"""`specfleet bench`: the sweep operators run by hand, automated.

For one target, start its runtime without speculation and at each draft length of
a sweep (on a free port, so a running fleet is not disturbed), send every workload
class `runs` times (each run on a fresh server where the drafter learns across
requests), and report tokens/s (mean and spread), draft acceptance and the speedup
against speculation off, measured in the same run. Output: a table on the terminal,
bench.json and bench.png, and the recommended setting, with caveats when the
evidence behind it is thin (one run: the spread is unknown; few drafted tokens).
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import statistics
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.bench.workloads import Workload
from supervisor.config.schema import Target
from supervisor.errors import SpecfleetError
from supervisor.launcher.process import ProcessLauncher
from supervisor.plugin.backend import Backend, LaunchSpec
from supervisor.supervision.probes import until_ready

OFF = "off"
# Fewer drafted tokens than this behind a recommended setting is too little to recommend
# from without a caveat: an acceptance rate measured on n drafted tokens has a 95 % interval
# of up to +-1.96 * 0.5 / sqrt(n), +-5 points at 400, and that is a floor: tokens drafted in
# one step succeed or fail together. The default bench (3 runs x 128 tokens x each
# workload's prompts) drafts thousands; `--max-tokens 32 --runs 1` can draft a handful.
MIN_DRAFTED_TOKENS = 400


@dataclass(frozen=True)
class RunResult:
    setting: str  # "off" or the draft length
    workload: str
    run: int
    tokens: int
    seconds: float
    draft_tokens: int
    accepted_tokens: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    setting: str
    workload: str
    tps_mean: float
    tps_stdev: float | None  # None with one run: unknown, not zero
    acceptance: float | None
    speedup: float | None  # against "off" for the same workload, same run
    runs: int = 1
    draft_tokens: int = 0


def sweep_lengths(low: int, high: int, current: int | None) -> list[int]:
    """Powers of two within the bounds, the bounds themselves and the current length."""
    lengths = {low, high}
    k = 1
    while k <= high:
        if k >= low:
            lengths.add(k)
        k *= 2
    if current is not None and low <= current <= high:
        lengths.add(current)
    return sorted(lengths)


def summarize(results: list[RunResult]) -> list[Summary]:
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.setting, r.workload), []).append(r)
    off = {w: statistics.fmean(x.tokens_per_second for x in rs)
           for (s, w), rs in groups.items() if s == OFF}
    out = []
    for (setting, workload), rs in groups.items():
        tps = [r.tokens_per_second for r in rs]
        drafted = sum(r.draft_tokens for r in rs)
        mean = statistics.fmean(tps)
        out.append(Summary(setting, workload, mean,
                           statistics.stdev(tps) if len(tps) > 1 else None,
                           sum(r.accepted_tokens for r in rs) / drafted if drafted else None,
                           mean / off[workload] if off.get(workload) else None,
                           runs=len(rs), draft_tokens=drafted))
    return out


def recommend(summary: list[Summary]) -> tuple[str, dict[str, str]]:
    """The best setting overall (geometric mean of speedups across workloads) and per workload."""
    per_workload: dict[str, str] = {}
    for w in {s.workload for s in summary}:
        rows = [s for s in summary if s.workload == w and s.speedup is not None]
        per_workload[w] = max(rows, key=lambda s: s.speedup or 0).setting if rows else OFF
    settings = {s.setting for s in summary}

    def score(setting: str) -> float:
        ups = [s.speedup for s in summary if s.setting == setting and s.speedup]
        return math.exp(statistics.fmean(math.log(u) for u in ups)) if ups else 0.0
    best = max(settings, key=lambda s: (score(s), s == OFF))
    return best, dict(sorted(per_workload.items()))


def caveats(summary: list[Summary], best: str, per_workload: dict[str, str]) -> list[str]:
    """Why the recommendation may not hold: each a sentence; none when the evidence suffices."""
    out = []
    if any(s.runs < 2 for s in summary):
        out.append("one run per setting: the spread of tokens/s is unknown (n/a), so a "
                   "difference may be noise; use --runs 3 or more")
    chosen = {(w, best) for w in per_workload} | set(per_workload.items())
    thin = sorted((s for s in summary if s.setting != OFF and (s.workload, s.setting) in chosen
                   and s.draft_tokens < MIN_DRAFTED_TOKENS),
                  key=lambda s: (s.workload, int(s.setting)))
    if thin:
        where = ", ".join(f"n={s.setting} on {s.workload}: {s.draft_tokens} drafted tokens"
                          for s in thin)
        out.append(f"too little drafting to judge acceptance ({where}; fewer than "
                   f"{MIN_DRAFTED_TOKENS}); use more --runs, a larger --max-tokens or more "
                   "prompts")
    return out


def render_table(summary: list[Summary]) -> str:
    def order(setting: str) -> int:
        return -1 if setting == OFF else int(setting)
    rows = [("workload", "setting", "tok/s", "±", "acceptance", "speedup")]
    for s in sorted(summary, key=lambda s: (s.workload, order(s.setting))):
        rows.append((s.workload, s.setting if s.setting == OFF else f"n={s.setting}",
                     f"{s.tps_mean:.1f}", "n/a" if s.tps_stdev is None else f"{s.tps_stdev:.1f}",
                     "-" if s.acceptance is None else f"{100 * s.acceptance:.0f}%",
                     "-" if s.speedup is None else f"{s.speedup:.2f}x"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)


def plot(summary: list[Summary], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for w in sorted({s.workload for s in summary}):
        rows = sorted((s for s in summary if s.workload == w and s.setting != OFF),
                      key=lambda s: int(s.setting))
        spread = [s.tps_stdev for s in rows]
        line = ax.errorbar([int(s.setting) for s in rows], [s.tps_mean for s in rows],
                           yerr=None if None in spread else spread, marker="o", capsize=3,
                           label=w)
        off = next((s for s in summary if s.workload == w and s.setting == OFF), None)
        if off is not None:
            ax.axhline(off.tps_mean, linestyle="--", color=line[0].get_color(), alpha=0.6,
                       label=f"{w}: speculation off")
    ax.set_xscale("log", base=2)
    lengths = sorted({int(s.setting) for s in summary if s.setting != OFF})
    ax.set_xticks(lengths, [str(k) for k in lengths])
    ax.set_xlabel("draft length")
    ax.set_ylabel("generated tokens/s")
    # From zero, so that a 6 % difference does not look like a cliff; room above the top line.
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BenchRunner:
    def __init__(self, target: Target, backend_cls: type[Backend], workloads: list[Workload],
                 runs: int, max_tokens: int, out_dir: Path,
                 progress: Callable[[str], None]) -> None:
        # A free port and host: a running fleet on the target's own port is not disturbed.
        self.target = target.model_copy(update={"port": _free_port(), "host": "127.0.0.1"})
        self.backend = backend_cls(self.target)
        self.workloads = workloads
        self.runs = runs
        self.max_tokens = max_tokens
        self.out_dir = out_dir
        self.progress = progress
        self.commands: dict[str, str] = {}

    async def run(self, lengths: list[int]) -> list[RunResult]:
        await self.backend.preflight()
        results: list[RunResult] = []
        settings = [OFF, *map(str, lengths)]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=600)) as http:
            for i, setting in enumerate(settings, 1):
                self.progress(f"[{i}/{len(settings)}] starting the server with "
                              f"{'speculation off' if setting == OFF else f'draft length {setting}'}")
                results += await self._measure(http, setting)
        return results

    async def _measure(self, http: aiohttp.ClientSession, setting: str) -> list[RunResult]:
        """Every workload `runs` times at one setting. A drafter that learns across requests
        (ngram-mod's pool) would draft a prompt it has seen from memory, so each of its runs
        gets a server of its own: run 2 is then measured as cold as run 1, and no workload
        profits from the one before it."""
        spec = self.backend.launch_spec(None if setting == OFF else int(setting),
                                        speculation=setting != OFF)
        self.commands[setting] = spec.shell_line()
        fresh = setting != OFF and self.backend.drafter_learns()
        jobs = [(w, run) for w in self.workloads for run in range(1, self.runs + 1)]
        groups = [[job] for job in jobs] if fresh else [jobs]
        out = []
        for group in groups:
            async with self._server(http, setting, spec):
                for w, run in group:
                    self.progress(f"      {w.name}: run {run}/{self.runs} "
                                  f"({len(w.prompts)} prompts x {self.max_tokens} tokens"
                                  + (", a fresh server: its drafter learns)" if fresh else ")"))
                    gens = [await self.backend.generate(http, p, self.max_tokens, w.sampling)
                            for p in w.prompts]
                    out.append(RunResult(setting, w.name, run, sum(g.tokens for g in gens),
                                         sum(g.seconds for g in gens),
                                         sum(g.draft_tokens for g in gens),
                                         sum(g.accepted_tokens for g in gens)))
        return out

    @contextlib.asynccontextmanager
    async def _server(self, http: aiohttp.ClientSession, setting: str,
                      spec: LaunchSpec) -> AsyncIterator[None]:
        with tempfile.TemporaryDirectory() as state:
            launcher = ProcessLauncher(self.out_dir / "logs", Path(state))
            proc = await launcher.start(f"bench-{setting}", spec)
            try:
                await self._wait_ready(http, proc)
                await self.backend.generate(http, "Hello", 8, {"temperature": 0.0})  # warm-up
                yield
            finally:
                await proc.stop(self.target.restart.stop_grace)

    async def _wait_ready(self, http: aiohttp.ClientSession, proc: Any) -> None:
        why = await until_ready(lambda: self.backend.probe(http), self.target.health,
                                lambda: proc.returncode, poll=0.25)
        if why is not None:
            raise SpecfleetError(f"the server {why}; its output:\n{proc.output_tail()}")


def write_report(out_dir: Path, target: Target, results: list[RunResult],
                 commands: dict[str, str]) -> tuple[str, Path, Path]:
    """Table text, bench.json and bench.png; returns (table with recommendation, json, png)."""
    summary = summarize(results)
    best, per_workload = recommend(summary)
    warnings = caveats(summary, best, per_workload)
    best_text = "speculation off" if best == OFF else f"draft length {best}"
    if warnings:
        best_text += " (tentative: see the caveats below)"
    table = render_table(summary)
    table += f"\n\nrecommended for this mix of workloads: {best_text}"
    table += "\nbest per workload: " + ", ".join(
        f"{w}: {'off' if s == OFF else 'n=' + s}" for w, s in per_workload.items())
    table += "".join(f"\ncaveat: {c}" for c in warnings)
    json_path, png_path = out_dir / "bench.json", out_dir / "bench.png"
    json_path.write_text(json.dumps({
        "target": target.name, "method": target.speculation.method,
        "variant": target.speculation.variant, "commands": commands,
        "results": [{**asdict(r), "tokens_per_second": round(r.tokens_per_second, 3)}
                    for r in results],
        "summary": [asdict(s) for s in summary],
        "recommended": best, "best_per_workload": per_workload, "caveats": warnings},
        indent=1))
    plot(summary, png_path, f"specfleet bench: {target.name} ({target.speculation.method})")
    return table, json_path, png_path
