"""A day of traffic in seconds: the tuner's real decision code against measured truth.

    .venv/bin/python benchmarks/trace_sim.py [--profile benchmarks/results/class_profile.json]
        [--setup pair-partial] [--trace benchmarks/traces/day.yaml] [--seeds 5] [--json OUT]

The truth is what `benchmarks/class_profile.py` measured live: for each setting (off,
each draft length), class and load (1 and 4 clients), the busy seconds per token and the
counters per token (drafted steps, draft tokens, accepted tokens per position, prompt
tokens). The trace (a YAML file: segments of traffic with their class shares, clients
and number of answers, and idle gaps) is played through, one answer after another, by
each strategy on the same draws:

  fixed     each setting all day;
  tuned     `supervisor.tuning.controller.TuningController`, unchanged: calibrated from the
            profile's synthetic and plain cells, fed an interval every `--interval` busy
            seconds (the counters the answers moved, with noise), asked for a decision
            after each; a switch is applied at the next answer and costs the setting's
            measured start time as busy time (served by nobody);
  oracle    the best setting for each segment, known in advance, switching between
            segments where that pays (charged the same start time; free across an idle
            gap).

Noise: each (setting, class, load) cell's speed is off by a factor drawn once per seed
(sd `--cell-noise`, the spread of identical flags measured twice), each answer's by
another (sd 5 %), each answer's rejections by another (sd 10 %: a draft position's share
rejected is the cell's times it, so text that accepts every draft stays so). Loads 2-3
interpolate between the measured 1 and 4; above 4 the server's 4 slots are full and the
rest queue (the load-4 cell). Reports tuned against the best fixed setting in hindsight,
the share of the headroom to the oracle it takes, restarts per hour and the worst hour,
restarts to settle each segment (a class never seen before / seen before), and the
answers served at a losing setting (> 5 % slower than the segment's best) per segment.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.tuning.controller import Observation, TuningController  # noqa: E402
from supervisor.tuning.cost import Interval, fit  # noqa: E402
from supervisor.tuning.load import bucket_of  # noqa: E402
from supervisor.tuning.prediction import OFF  # noqa: E402
from supervisor.tuning.rule import KEEP  # noqa: E402

LOSING = 1.05


@dataclass(frozen=True)
class Cell:
    """Per token of one (setting, class, load): busy seconds and counter increments."""

    seconds: float
    drafts: float
    draft_tokens: float
    accepted: float
    prompt: float
    per_position: tuple[float, ...]


def setting_of(name: str) -> int | None:
    if name == "off":
        return OFF
    if name.startswith("k=") and " " not in name:
        return int(name[2:])
    return None


def per_token(c: dict[str, Any]) -> Cell:
    n = c["counters"]
    t = n["tokens"]
    return Cell(c["wall_seconds"] / t, n["drafts"] / t, n["draft_tokens"] / t,
                n["accepted"] / t, n["prompt_tokens"] / t,
                tuple(p / t for p in n["per_position"]))


class Truth:
    """The measured table of one setup."""

    def __init__(self, profile: dict[str, Any], setup: str) -> None:
        settings = profile["setups"][setup]
        self.cells: dict[tuple[int, str, int], Cell] = {}
        self.ready: dict[int, float] = {}
        self.calibration: dict[str, list[Interval]] = {}
        for name, cells in settings.items():
            k = setting_of(name)
            for c in cells:
                if k is not None:
                    self.cells[(k, c["class"], c["load"])] = per_token(c)
                    self.ready[k] = c.get("ready_seconds", 5.0)
                if k is None or (k == OFF and c["class"] == "code"):
                    n = c["counters"]
                    self.calibration.setdefault(bucket_of(c["load"]), []).append(Interval(
                        c["wall_seconds"], n["tokens"], n["drafts"], n["draft_tokens"],
                        n["accepted"], n["prompt_tokens"], speculating=k != OFF))
        # No synthetic acceptance (n-gram drafts): the daemon calibrates the plain step
        # only and learns a drafted step's cost from serving; so does the simulated tuner.
        self.shaped = any(" synth=" in name for name in settings)
        self.settings = sorted({k for k, _, _ in self.cells})
        # The daemon's calibration runs beside the serving server before the first
        # decision: three servers (one without synthetic acceptance), 6 completions of 64
        # tokens at one request and 3 rounds of 4 at four, each. On 2 cores it takes about
        # half of the machine meanwhile: charged as half its time, during which the tuner
        # serves at its start setting and decides nothing.
        off1 = self.cells.get((OFF, "code", 1))
        off4 = self.cells.get((OFF, "code", 4))
        servers = 3 if self.shaped else 1
        one = self.ready.get(OFF, 5.0) + 6 * 64 * (off1.seconds if off1 else 0.05) + \
            12 * 64 * (off4.seconds if off4 else 0.05)
        self.calibration_seconds = servers * one
        self.classes = sorted({c for _, c, _ in self.cells})
        self.fills_length = not setup.startswith("ngram")

    def cell(self, k: int, cls: str, load: int) -> Cell:
        if load <= 1 or load >= 4:
            return self.cells[(k, cls, 1 if load <= 1 else 4)]
        a, b = self.cells[(k, cls, 1)], self.cells[(k, cls, 4)]
        w = (load - 1) / 3
        mix = [x * (1 - w) + y * w for x, y in zip(
            (a.seconds, a.drafts, a.draft_tokens, a.accepted, a.prompt),
            (b.seconds, b.drafts, b.draft_tokens, b.accepted, b.prompt), strict=True)]
        pos = tuple(x * (1 - w) + y * w for x, y in zip(a.per_position, b.per_position,
                                                         strict=False))
        return Cell(*mix, pos)


@dataclass
class Answer:
    cls: str
    tokens: int
    speed_noise: float
    acc_noise: float


def draw(trace: dict[str, Any], seed: int) -> list[dict[str, Any]]:
    """The trace's segments with their answers drawn (the same for every strategy)."""
    rng = random.Random(seed)
    out = []
    for seg in trace["segments"]:
        if "idle" in seg:
            out.append({"idle": float(seg["idle"]) * 60})
            continue
        mix = seg["mix"]
        classes, weights = list(mix), list(mix.values())
        answers = [Answer(rng.choices(classes, weights)[0], int(trace.get("tokens", 192)),
                          rng.lognormvariate(0, 0.05), rng.lognormvariate(0, 0.1))
                   for _ in range(int(seg["requests"]))]
        out.append({"clients": int(seg["clients"]), "answers": answers, "mix": mix})
    return out


def biased(truth: Truth, seed: int, sd: float) -> dict[tuple[int, str, int], float]:
    rng = random.Random(seed * 7919 + 1)
    return {key: rng.lognormvariate(0, sd) for key in sorted(truth.cells)}


class Run:
    """One strategy through the day: busy seconds, restarts, answers at a losing setting."""

    def __init__(self, truth: Truth, bias: dict[tuple[int, str, int], float]) -> None:
        self.truth, self.bias = truth, bias
        self.busy = 0.0
        self.clock = 0.0
        self.restarts: list[tuple[float, int]] = []  # (clock, segment)
        self.losing: list[int] = []
        self.by_segment: dict[int, float] = {}  # busy seconds in each segment, restarts too
        self.path: list[int] = []  # the oracle's setting for each traffic segment

    def answer_seconds(self, k: int, a: Answer, load: int) -> float:
        c = self.truth.cell(k, a.cls, load)
        b = self.bias.get((k, a.cls, min(4, max(1, load))), 1.0)
        # An answer that accepts more than the cell's mean takes fewer steps.
        return a.tokens * c.seconds * b * a.speed_noise * noisy(a, c)[4]

    def restart(self, k: int, segment: int, free: bool = False) -> None:
        if not free:
            self.busy += self.truth.ready[k]
            self.clock += self.truth.ready[k]
        self.restarts.append((self.clock, segment))


def segment_best(truth: Truth, run: Run, seg: dict[str, Any]) -> dict[int, float]:
    return {k: sum(run.answer_seconds(k, a, seg["clients"]) for a in seg["answers"])
            for k in truth.settings}


def play_fixed(truth: Truth, day: list[dict[str, Any]], bias: dict, k: int) -> Run:
    run = Run(truth, bias)
    for seg in day:
        if "idle" in seg:
            run.clock += seg["idle"]
            continue
        t = segment_best(truth, run, seg)[k]
        run.busy += t
        run.clock += t
    return run


def play_oracle(truth: Truth, day: list[dict[str, Any]], bias: dict) -> Run:
    """Viterbi over segments: each segment's busy time at each setting plus restarts."""
    run = Run(truth, bias)
    costs = [None if "idle" in s else segment_best(truth, run, s) for s in day]
    best: dict[int, tuple[float, list[int]]] = {k: (0.0, []) for k in truth.settings}
    idle_before = False
    for cost in costs:
        if cost is None:
            idle_before = True
            continue
        new = {}
        for k in truth.settings:
            new[k] = min(((t + cost[k] + (0 if j == k or idle_before else truth.ready[k]),
                           [*path, k]) for j, (t, path) in best.items()), key=lambda x: x[0])
        best, idle_before = new, False
    total, path = min(best.values(), key=lambda x: x[0])
    run.busy, run.path = total, path
    run.restarts = [(0.0, i) for i, (a, b) in enumerate(itertools.pairwise(path)) if a != b]
    return run


def play_tuned(truth: Truth, day: list[dict[str, Any]], bias: dict, start: int,
               interval: float, arrival: bool = True
               ) -> tuple[Run, TuningController, list[dict[str, Any]]]:
    """`arrival`: the controller is asked as each request arrives (the proxy's
    `arriving`), as the daemon does."""
    run = Run(truth, bias)
    lengths = [k for k in truth.settings if k != OFF]
    # Only the measured lengths can be played: the controller chooses among them.
    ctrl = TuningController(lengths=lengths, current=start, fills_length=truth.fills_length)
    full = {bucket: cost for bucket, cells in truth.calibration.items()
            if (cost := fit(cells)) is not None}
    # The calibration's off server comes first (a third of it where lengths follow): from
    # then on the daemon may turn a losing setting off (AutoTuner.plain_calibrated).
    plain = {bucket: cost for bucket, cells in truth.calibration.items()
             if (cost := fit([c for c in cells if not c.speculating])) is not None}
    decisions: list[dict[str, Any]] = []
    pending = None
    calibrating = truth.calibration_seconds  # busy seconds until its calibration is in
    stage = "none"
    run.busy += truth.calibration_seconds / 2
    for si, seg in enumerate(day):
        if "idle" in seg:
            run.clock += seg["idle"]
            continue
        load = seg["clients"]
        per_setting = segment_best(truth, run, seg)
        best = min(per_setting.values())
        acc: dict[str, Any] = _empty()
        busy_before = run.busy
        for a in seg["answers"]:
            if pending is None and stage != "none" and arrival:
                # As the proxy asks the daemon's tuner before it relays a request.
                pending = ctrl.arriving(a.cls, load, truth.ready[ctrl.current],
                                        only_off=stage == "plain")
            if pending is not None:
                run.restart(pending.setting, si)
                ctrl.switched(pending)
                decisions.append({"segment": si, "clock_h": round(run.clock / 3600, 2),
                                  "action": pending.action, "setting": pending.setting,
                                  "reason": pending.reason})
                pending = None
            k = ctrl.current
            if per_setting[k] > best * LOSING:
                run.losing.append(si)
            c = truth.cell(k, a.cls, load)
            secs = run.answer_seconds(k, a, load)
            _add(acc, a, c, secs)
            run.busy += secs
            run.clock += secs
            calibrating -= secs
            if acc["seconds"] >= interval:
                if stage != "full" and calibrating <= 0:
                    ctrl.calibrated(full, truth.shaped)
                    stage = "full"
                elif stage == "none" and truth.shaped and \
                        calibrating <= truth.calibration_seconds * 2 / 3:
                    ctrl.calibrated(plain, shaped=False)
                    stage = "plain"
                ctrl.observe(_observation(acc, k, load))
                acc = _empty()
                if stage == "none":
                    continue
                d = ctrl.decide(switch_cost=truth.ready[k], only_off=stage == "plain")
                if d is not None and d.action != KEEP:
                    pending = d
        if acc["seconds"] > 0:
            ctrl.observe(_observation(acc, ctrl.current, load))
        run.by_segment[si] = run.busy - busy_before
    return run, ctrl, decisions


def by_segment(truth: Truth, day: list[dict[str, Any]], tuned: Run, oracle: Run
               ) -> list[dict[str, Any]]:
    """Where tuned lost its time: each traffic segment's busy seconds, tuned's (restarts
    in), the segment's best setting's and the oracle's choice (its restarts not in)."""
    out, traffic = [], 0
    for si, seg in enumerate(day):
        if "idle" in seg:
            continue
        per = segment_best(truth, tuned, seg)
        best = min(per, key=lambda k: per[k])
        k = oracle.path[traffic] if traffic < len(oracle.path) else None
        traffic += 1
        out.append({"segment": si, "mix": seg["mix"], "clients": seg["clients"],
                    "best": best, "best_s": round(per[best], 1), "oracle": k,
                    "oracle_s": round(per[k], 1) if k is not None else None,
                    "tuned_s": round(tuned.by_segment.get(si, 0.0), 1)})
    return out


def _empty() -> dict[str, Any]:
    return {"seconds": 0.0, "tokens": 0.0, "drafts": 0.0, "draft_tokens": 0.0,
            "accepted": 0.0, "prompt": 0.0, "per_position": [], "classes": {}}


def noisy(a: Answer, c: Cell) -> tuple[float, float, float, list[float], float]:
    """One answer's counters: accepted, drafted steps, draft tokens, accepted per position,
    and its steps over the cell's for as many tokens. Its acceptance differs from the
    cell's on the rejection side: each position's share of drafted steps rejected there is
    the cell's times the answer's draw, so a class that accepts nearly every draft (code
    copied) stays near it and one that rejects most (prose) varies most. The share of
    steps that draft is the cell's; the rest follows (every step yields one token plus
    what it accepted)."""
    n = a.tokens
    cell_steps = max(1e-9, n * (1 - c.accepted))
    if c.drafts <= 0:
        return 0.0, 0.0, 0.0, [0.0] * len(c.per_position), 1.0
    share = c.drafts * n / cell_steps  # drafted steps over all steps
    rates = [min(1.0, max(0.0, 1 - (1 - p / c.drafts) * a.acc_noise)) for p in c.per_position]
    steps = n / (1 + share * sum(rates))
    drafted = share * steps
    size = c.draft_tokens / c.drafts
    return drafted * sum(rates), drafted, drafted * size, [drafted * r for r in rates], \
        steps / cell_steps


def _add(acc: dict[str, Any], a: Answer, c: Cell, secs: float) -> None:
    n = a.tokens
    accepted, drafted, draft_tokens, pos, _ = noisy(a, c)
    acc["seconds"] += secs
    acc["tokens"] += n
    acc["drafts"] += drafted
    acc["draft_tokens"] += draft_tokens
    acc["accepted"] += accepted
    acc["prompt"] += c.prompt * n
    acc["per_position"] = [x + y for x, y in zip(acc["per_position"], pos, strict=False)] \
        if acc["per_position"] else pos
    acc["classes"][a.cls] = acc["classes"].get(a.cls, 0.0) + n


def _observation(acc: dict[str, Any], k: int, load: int) -> Observation:
    iv = Interval(acc["seconds"], acc["tokens"], acc["drafts"], acc["draft_tokens"],
                  acc["accepted"], acc["prompt"], speculating=k != OFF)
    return Observation(iv, k, load, acc["per_position"], dict(acc["classes"]))


def settle(day: list[dict[str, Any]], run: Run) -> dict[str, int]:
    """The most restarts within one segment, for a main class never seen and seen before."""
    seen: set[str] = set()
    worst = {"new": 0, "seen": 0}
    for si, seg in enumerate(day):
        if "idle" in seg:
            continue
        main = max(seg["mix"], key=lambda c: seg["mix"][c])
        n = sum(1 for _, s in run.restarts if s == si)
        kind = "seen" if main in seen else "new"
        worst[kind] = max(worst[kind], n)
        seen.add(main)
    return worst


def worst_hour(run: Run) -> int:
    times = sorted(t for t, _ in run.restarts)
    return max((sum(1 for u in times if t <= u < t + 3600) for t in times), default=0)


def simulate(profile: dict[str, Any], setup: str, trace: dict[str, Any], seed: int,
             interval: float = 15.0, cell_noise: float = 0.03,
             start: int | None = None, arrival: bool = True) -> dict[str, Any]:
    truth = Truth(profile, setup)
    day = draw(trace, seed)
    bias = biased(truth, seed, cell_noise)
    fixed = {k: play_fixed(truth, day, bias, k) for k in truth.settings}
    oracle = play_oracle(truth, day, bias)
    # The pair example's start (examples/pair.yaml), else the longest measured (n-gram: the
    # runtime's default n-max 64).
    first = start if start is not None else 4 if 4 in truth.settings else max(truth.settings)
    tuned, ctrl, decisions = play_tuned(truth, day, bias, first, interval, arrival)
    best_k = min(fixed, key=lambda k: fixed[k].busy)
    best = fixed[best_k].busy
    head = best - oracle.busy
    hours = tuned.clock / 3600
    return {
        "seed": seed, "setup": setup, "best_fixed": best_k,
        "busy_s": {"tuned": round(tuned.busy), "oracle": round(oracle.busy),
                   **{f"fixed {k}": round(r.busy) for k, r in fixed.items()}},
        "tuned_vs_best_fixed": round(best / tuned.busy, 4),
        "tuned_vs_off": round(fixed[OFF].busy / tuned.busy, 4),
        "oracle_vs_best_fixed": round(best / oracle.busy, 4),
        "headroom_taken": round((best - tuned.busy) / head, 3) if head > 1e-9 else None,
        "restarts": len(tuned.restarts), "restarts_per_hour": round(len(tuned.restarts) / hours, 2),
        "worst_hour_restarts": worst_hour(tuned), "settle_restarts": settle(day, tuned),
        "losing_answers": len(tuned.losing),
        "losing_by_segment": {str(s): tuned.losing.count(s) for s in sorted(set(tuned.losing))},
        "checks": ctrl.checks, "decisions": decisions,
        "segments": by_segment(truth, day, tuned, oracle)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=REPO / "benchmarks/results/class_profile.json")
    ap.add_argument("--setup", default="pair-partial")
    ap.add_argument("--trace", type=Path, default=REPO / "benchmarks/traces/day.yaml")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--cell-noise", type=float, default=0.03)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-arrival", action="store_true",
                    help="decide from served intervals only, never as a request arrives")
    args = ap.parse_args()
    profile = json.loads(args.profile.read_text())
    trace = yaml.safe_load(args.trace.read_text())
    results = [simulate(profile, args.setup, trace, s, args.interval, args.cell_noise,
                        arrival=not args.no_arrival)
               for s in range(1, args.seeds + 1)]
    print(f"{trace.get('name', args.trace.name)} on {args.setup}, {args.seeds} seeds")
    print(f"{'seed':>4} {'best fixed':>10} {'tuned/best':>10} {'tuned/off':>9} "
          f"{'oracle/best':>11} {'headroom':>8} {'restarts/h':>10} {'worst h':>7} "
          f"{'settle new/seen':>15} {'losing':>6}")
    for r in results:
        print(f"{r['seed']:>4} {r['best_fixed']!s:>10} {r['tuned_vs_best_fixed']:>10.3f} "
              f"{r['tuned_vs_off']:>9.3f} {r['oracle_vs_best_fixed']:>11.3f} "
              f"{r['headroom_taken']!s:>8} {r['restarts_per_hour']:>10} "
              f"{r['worst_hour_restarts']:>7} "
              f"{r['settle_restarts']['new']:>7}/{r['settle_restarts']['seen']:<7} "
              f"{r['losing_answers']:>6}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
