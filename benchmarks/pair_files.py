"""The draft-model pair `specfleet setup --pair` makes: each file's speed alone and each
draft's acceptance and speedup as the F32 target's draft, per workload and draft length.

    .venv/bin/python benchmarks/pair_files.py [--tokens 64] [--lengths 2,4,8,16] [--threads 2]

One llama-server at a time (`--ctx-size 2048 --parallel 1`), the built-in workloads of
`specfleet bench` (code and prose at temperature 0, prose at 0.8 with its anti-repetition
sampling), every prompt of each once per row, `cache_prompt: false`:

  alone     the F32 target, the Q4_K_M, the partial draft, without speculation
  draft     the F32 target with each draft at each --lengths (`--spec-type draft-simple`)

Speeds are llama-server's own `predicted_per_second` over each row's requests (tokens over
generation time); the ratios are to the F32 target alone on the same workload, measured
in the same run. Acceptance is drafted tokens accepted over drafted. Nothing else should
run meanwhile (the script says what it saw running). Writes
benchmarks/results/pair_files.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from daemon_overhead import others_running  # noqa: E402
from serverproc import Server, free_port, http  # noqa: E402

from plugins.llamacpp import provision  # noqa: E402
from supervisor.bench.workloads import BUILT_IN  # noqa: E402
from supervisor.plugin import assemble_pair  # noqa: E402

WORKLOADS = {"code t=0": ("code", {"temperature": 0}), "prose t=0": ("prose", {"temperature": 0}),
             "prose t=0.8": ("prose", None)}


def row(binary: Path, model: str, draft: str | None, length: int, workloads: dict[str, Any],
        tokens: int, threads: int, work: Path) -> dict[str, Any]:
    port = free_port()
    cmd = [str(binary), "-m", model, "--port", str(port), "--ctx-size", "2048",
           "--parallel", "1", "--threads", str(threads), "--metrics"]
    if draft is not None:
        cmd += ["--spec-type", "draft-simple", "--spec-draft-model", draft,
                "--spec-draft-n-max", str(length)]
    server = Server(cmd, dict(os.environ), port, work / "server.log")
    out: dict[str, Any] = {}
    try:
        server.wait_ready(300)
        for label, (name, sampling) in workloads.items():
            w = BUILT_IN[name]
            n = seconds = drafted = accepted = 0.0
            for prompt in w.prompts:
                status, body = http(f"{server.base}/completion", {
                    "prompt": prompt, "n_predict": tokens, "cache_prompt": False,
                    **(sampling if sampling is not None else w.sampling)})
                if status != 200:
                    raise RuntimeError(f"{status}: {body[:300]!r}")
                t = json.loads(body)["timings"]
                n += t["predicted_n"]
                seconds += t["predicted_ms"] / 1000
                drafted += t.get("draft_n", 0) or 0
                accepted += t.get("draft_n_accepted", 0) or 0
            out[label] = {"tokens_per_s": round(n / seconds, 2),
                          "acceptance": round(accepted / drafted, 3) if drafted else None}
    finally:
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--lengths", default="2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    binary = provision.cached_llama_server() or provision.build_llama_server()
    pair = {k: str(v) for k, v in assemble_pair(lambda m: print(m, file=sys.stderr)).items()}
    lengths = [int(x) for x in args.lengths.split(",")]
    others = set(others_running())
    result: dict[str, Any] = {"args": vars(args), "alone": {}, "draft": {}}
    with tempfile.TemporaryDirectory(prefix="pair-files-") as tmp:
        work = Path(tmp)
        for role in ("target", "close_draft", "partial_draft"):
            result["alone"][role] = row(binary, pair[role], None, 0, WORKLOADS, args.tokens,
                                        args.threads, work)
            print(role, result["alone"][role], file=sys.stderr, flush=True)
        for draft in ("close_draft", "partial_draft"):
            for n in lengths:
                key = f"{draft} n={n}"
                result["draft"][key] = row(binary, pair["target"], pair[draft], n, WORKLOADS,
                                           args.tokens, args.threads, work)
                print(key, result["draft"][key], file=sys.stderr, flush=True)
                others.update(others_running())
    result["others_running"] = sorted(others)
    report(result)
    return 0


def report(result: dict[str, Any]) -> None:
    base = result["alone"]["target"]
    labels = list(base)
    print("speed as a ratio to the F32 target alone (tokens/s of the target alone in the "
          "header); acceptance of drafted tokens")
    print(f"{'':24}" + "".join(f"{label + ' ' + str(base[label]['tokens_per_s']):>26}"
                               for label in labels))
    for section in ("alone", "draft"):
        for key, cells in result[section].items():
            line = f"{section + ' ' + key:24}"
            for label in labels:
                ratio = cells[label]["tokens_per_s"] / base[label]["tokens_per_s"]
                acc = cells[label]["acceptance"]
                line += f"{f'{ratio:.2f}x' + (f' acc {acc:.0%}' if acc is not None else ''):>26}"
            print(line)
    if result["others_running"]:
        print("other load seen:", result["others_running"])
    out = REPO / "benchmarks" / "results" / "pair_files.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    sys.exit(main())
