"""What the tuner's model and the trace simulator stand on, measured live: for each
setting (off, each draft length) the seconds a step costs and what each class of request
accepts, on the draft-model pair (`specfleet setup --pair`) and on n-gram.

    .venv/bin/python benchmarks/class_profile.py [--tokens 192] [--requests 3] \
        [--requests-loaded 1] [--class-requests prose=3/1] [--off-again] \
        [--setups pair-partial,pair-close,ngram] \
        [--loads 1,4] [--out benchmarks/results/class_profile.json]

Three kinds of cell, each on a fresh llama-server (`--ctx-size 4096 --parallel 4`,
`--threads 2`, `cache_prompt: false`, `ignore_eos`, so every request makes `--tokens`):

  text       a class of request (code at temperature 0, prose at 0.8 with anti-repetition
             sampling, chat at 0.7 through /v1/chat/completions) at a setting and a load
             (clients sending at once): the counters of /metrics before and after
             (decode seconds, tokens, verification steps, draft tokens, accepted per
             position, `n_decode_total`), each response's `timings` and the wall time;
  synthetic  the same draft at each length with `--spec-synth-rates r,...,r` (every
             position accepted with probability r, so a step accepts 0 or k): what a
             drafted step costs at a known acceptance, apart from any text (two values of
             r separate the cost of a drafted token from that of an accepted one);
  off        no speculation, per class and load: the plain step.

Setups: `pair-partial` (the F32 target, the draft without two blocks), `pair-close` (the
F32 target, its own Q4_K_M as draft: ~100 % at temperature 0) and `ngram` (the Q4_K_M
with `--spec-type ngram-mod`, lengths as its `--spec-ngram-mod-n-max`). Nothing else
should run meanwhile: what the script saw running is in the result. The JSON is the
trace simulator's input (benchmarks/trace_sim.py) and the table docs/tuning.md checks
the model against.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from daemon_overhead import others_running  # noqa: E402
from serverproc import Server, cpu_model, free_port, http  # noqa: E402

from plugins.llamacpp import provision  # noqa: E402
from supervisor.bench.workloads import BUILT_IN  # noqa: E402
from supervisor.plugin import assemble_pair, parse_prometheus  # noqa: E402

CHAT = ("Explain briefly why the sky is blue.", "Give three tips for a job interview.",
        "What should I pack for a weekend of hiking?")
CLASSES: dict[str, dict[str, Any]] = {
    "code": {"endpoint": "/completion", "workload": "code", "sampling": {"temperature": 0.0}},
    "prose": {"endpoint": "/completion", "workload": "prose",
              "sampling": {"temperature": 0.8, "top_p": 0.95, "repeat_penalty": 1.3}},
    "chat": {"endpoint": "/v1/chat/completions", "workload": None,
             "sampling": {"temperature": 0.7, "top_p": 0.95}},
}
COUNTERS = {"tokens": "llamacpp:tokens_predicted_total",
            "decode_seconds": "llamacpp:tokens_predicted_seconds_total",
            "n_decode": "llamacpp:n_decode_total",
            "drafts": "llamacpp:spec_decode_num_drafts_total",
            "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
            "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
            "prompt_tokens": "llamacpp:prompt_tokens_total"}
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"


def scrape(base: str) -> dict[str, Any]:
    status, body = http(f"{base}/metrics", timeout=30)
    if status != 200:
        raise RuntimeError(f"/metrics {status}")
    s = parse_prometheus(body.decode())
    out: dict[str, Any] = {k: s.total(name) for k, name in COUNTERS.items()}
    out["per_position"] = {int(p): v for p, v in s.by_label(PER_POS, "position").items()}
    return out


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: round(after[k] - before[k], 6) for k in COUNTERS}
    positions = sorted(set(before["per_position"]) | set(after["per_position"]))
    out["per_position"] = [int(after["per_position"].get(p, 0) - before["per_position"].get(p, 0))
                           for p in positions]
    return out


def request(base: str, cls: str, i: int, tokens: int) -> dict[str, Any]:
    spec = CLASSES[cls]
    common = {"cache_prompt": False, "ignore_eos": True, **spec["sampling"]}
    if spec["endpoint"] == "/completion":
        body = {"prompt": BUILT_IN[spec["workload"]].prompt(i), "n_predict": tokens, **common}
    else:
        body = {"messages": [{"role": "user", "content": CHAT[i % len(CHAT)]}],
                "max_tokens": tokens, **common}
    status, raw = http(base + spec["endpoint"], body)
    if status != 200:
        raise RuntimeError(f"{spec['endpoint']} {status}: {raw[:300]!r}")
    t = json.loads(raw)["timings"]
    return {k: t.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms",
                                  "draft_n", "draft_n_accepted")}


def cell(base: str, cls: str, load: int, requests: int, tokens: int) -> dict[str, Any]:
    """`requests` requests of class `cls` from each of `load` clients sending at once."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        try:
            for r in range(requests):
                got = request(base, cls, 1000 * c + r, tokens)
                with lock:
                    results.append(got)
        except BaseException as exc:
            errors.append(exc)

    before = scrape(base)
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(load)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    if errors:
        raise RuntimeError(f"{cls} at load {load}: {errors[0]}")
    return {"class": cls, "load": load, "wall_seconds": round(wall, 3),
            "counters": delta(before, scrape(base)), "requests": results}


def server_cmd(binary: Path, model: str, threads: int, port: int) -> list[str]:
    return [str(binary), "-m", model, "--port", str(port), "--ctx-size", "4096",
            "--parallel", "4", "--threads", str(threads), "--metrics"]


def run_setting(binary: Path, model: str, spec_args: list[str], cells: list[tuple[str, int]],
                args: argparse.Namespace, work: Path, counts_as: str | None = None
                ) -> list[dict[str, Any]]:
    """`counts_as`: the name `--class-requests` knows these cells by (synthetic ones:
    "synth"), if not their class's."""
    port = free_port()
    server = Server(server_cmd(binary, model, args.threads, port) + spec_args,
                    dict(os.environ), port, work / "server.log")
    try:
        ready = server.wait_ready(300)
        # One short request first: the first decode after a load pays page faults and
        # buffer set-up that no later step pays.
        request(server.base, "code", 999, 16)
        return [{**cell(server.base, cls, load, answers(args, counts_as or cls, load),
                        args.tokens),
                 "ready_seconds": round(ready, 2)} for cls, load in cells]
    finally:
        server.stop()


def answers(args: argparse.Namespace, cls: str, load: int) -> int:
    """Answers per client of a cell: `--class-requests` for the class, else the default."""
    for item in filter(None, args.class_requests.split(",")):
        name, _, counts = item.partition("=")
        one, _, loaded = counts.partition("/")
        if name == cls:
            return int(one) if load == 1 else int(loaded or 1)
    return args.requests if load == 1 else args.requests_loaded


def merged(passes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Off measured before a setup's settings and again after them, as one cell per class
    and load (counters and wall time summed), each pass's tokens per second kept
    (`passes`): how far the machine drifted while the setups ran."""
    out = []
    for cells in zip(*passes, strict=True):
        first = cells[0]
        counters = {k: sum(c["counters"][k] for c in cells) if k != "per_position" else []
                    for k in first["counters"]}
        out.append({**first, "wall_seconds": round(sum(c["wall_seconds"] for c in cells), 3),
                    "counters": counters, "requests": [r for c in cells for r in c["requests"]],
                    "passes": [round(c["counters"]["tokens"] / c["wall_seconds"], 2)
                               for c in cells]})
    return out


def draft_args(draft: str, k: int) -> list[str]:
    return ["--spec-type", "draft-simple", "--spec-draft-model", draft,
            "--spec-draft-n-max", str(k)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--requests", type=int, default=3, help="per class at load 1")
    ap.add_argument("--requests-loaded", type=int, default=1,
                    help="per class and client at the higher loads")
    ap.add_argument("--class-requests", default="",
                    help="per class, e.g. prose=3/1,synth=3/1: answers at load 1 / per "
                    "client above (a slow class's cells are long already; synth: the "
                    "synthetic-acceptance cells)")
    ap.add_argument("--off-again", action="store_true",
                    help="measure off again after each setup's settings (merged)")
    ap.add_argument("--loads", default="1,4")
    ap.add_argument("--lengths", default="2,4,8,16")
    ap.add_argument("--ngram-lengths", default="8,16,32,64")
    ap.add_argument("--rates", default="0.2,0.8", help="synthetic acceptance levels")
    ap.add_argument("--setups", default="pair-partial,pair-close,ngram")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/class_profile.json")
    args = ap.parse_args()
    binary = provision.cached_llama_server() or provision.build_llama_server()
    pair = {k: str(v) for k, v in assemble_pair(lambda m: print(m, file=sys.stderr)).items()}
    q4 = pair["close_draft"]
    loads = [int(x) for x in args.loads.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    rates = [float(x) for x in args.rates.split(",")]
    setups = args.setups.split(",")
    text_cells = [(c, load) for load in loads for c in CLASSES]
    others = set(others_running())
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "cpu": cpu_model(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "setups": {}}
    t0 = time.monotonic()

    def record(setup: str, setting: str, cells: list[dict[str, Any]]) -> None:
        result["setups"].setdefault(setup, {})[setting] = cells
        others.update(others_running())
        result["others_running"] = sorted(others)
        args.out.write_text(json.dumps(result, indent=1))  # what is measured so far survives
        print(f"{time.monotonic() - t0:7.0f}s {setup} {setting}: " + ", ".join(
            f"{c['class']}@{c['load']} {c['counters']['tokens'] / c['wall_seconds']:.1f} tok/s"
            for c in cells), file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="class-profile-") as tmp:
        work = Path(tmp)
        if any(s.startswith("pair") for s in setups):
            off = run_setting(binary, pair["target"], [], text_cells, args, work)
            off_passes = [off]
        for setup in setups:
            if setup == "ngram":
                off_q4 = run_setting(binary, q4, [], text_cells, args, work)
                record(setup, "off", off_q4)
                for k in (int(x) for x in args.ngram_lengths.split(",")):
                    record(setup, f"k={k}", run_setting(
                        binary, q4, ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max",
                                     str(k)], text_cells, args, work))
                if args.off_again:
                    record(setup, "off", merged(
                        [off_q4, run_setting(binary, q4, [], text_cells, args, work)]))
                continue
            draft = pair["partial_draft" if setup == "pair-partial" else "close_draft"]
            record(setup, "off", off)
            for k in lengths:
                record(setup, f"k={k}", run_setting(binary, pair["target"], draft_args(draft, k),
                                                    text_cells, args, work))
                for r in rates:
                    synth = ["--spec-synth-rates", ",".join([str(r)] * k)]
                    record(setup, f"k={k} synth={r}", run_setting(
                        binary, pair["target"], draft_args(draft, k) + synth,
                        [("code", load) for load in loads], args, work, "synth"))
            if args.off_again:  # each pair setup's pass joins the passes before it
                off_passes.append(run_setting(binary, pair["target"], [], text_cells, args,
                                              work))
                record(setup, "off", merged(off_passes))
    result["seconds"] = round(time.monotonic() - t0)
    result["others_running"] = sorted(others)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} in {result['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
