"""What loading on demand adds to a cold start (issue 16): time to the first token of a
request for an unloaded target through specfleet's proxy, against the target's own load
time measured in the same run: the same llama-server command line started by hand,
/health polled every 10 ms, then the same request sent to it directly.

    .venv/bin/python benchmarks/cold_start.py [--pairs 8] [--max-tokens 8]

One `specfleet run` with one target (gemma-3-270m Q4_K_M on the CPU, `start: on_demand`,
`idle_unload: 1s`). Each pair: a direct cold start and a cold start through specfleet, the
order flipped every pair so that drift of the machine hits both alike; between two of
specfleet's, the target unloads itself (idle_unload). The ratio is the median of per-pair
ratios; goal: under 1.10 (specfleet adds under 10 % to the load time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.serverproc import Server, free_port, http  # noqa: E402
from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

DIRECT_POLL = 0.01  # seconds between /health polls of the hand-started server
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


async def first_token(session: aiohttp.ClientSession, base: str, model: str,
                      max_tokens: int) -> float:
    """Seconds from sending a streamed completion to its first token."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    started = time.perf_counter()
    first = None
    async with session.post(f"{base}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if first is None and line.startswith(b"data: ") and b'"text"' in line:
                first = time.perf_counter()
    assert first is not None
    return first - started


async def direct_cold_start(argv: list[str], env: dict[str, str], model: str,
                            max_tokens: int, log: Path) -> float:
    """The target's own load time: spawn to first token, nothing in between but polling."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    started = time.perf_counter()
    server = Server(argv, {**os.environ, **env}, port, log)
    try:
        async with aiohttp.ClientSession() as s:
            while True:
                try:
                    async with s.get(f"{server.base}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if server.proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited: {log.read_text()[-2000:]}")
                await asyncio.sleep(DIRECT_POLL)
            await first_token(s, server.base, model, max_tokens)
        return time.perf_counter() - started
    finally:
        server.stop()


def target_state(api: str, name: str) -> dict:
    try:
        status, body = http(f"http://{api}/v1/targets/{name}", timeout=10)
    except OSError:  # the daemon is not listening yet
        return {}
    return json.loads(body) if status == 200 else {}


def wait_unloaded(api: str, name: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if target_state(api, name).get("state") == "unloaded":
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not unload within {limit:.0f} s")


async def measure(fleet: Path, work: Path, pairs: int, max_tokens: int) -> dict:
    doc = yaml.safe_load(fleet.read_text())
    api, proxy = doc["daemon"]["api"], "http://" + doc["daemon"]["proxy"]["listen"]
    async with aiohttp.ClientSession() as s:
        await first_token(s, proxy, "cold", max_tokens)  # warm-up: caches, the run record
    record = json.loads((work / "state" / "runs" / "cold.json").read_text())
    argv, env = record["argv"], record.get("env") or {}
    out: dict[str, list[float]] = {"direct": [], "specfleet": [], "daemon_cold_start": []}
    for i in range(pairs):
        order = ["direct", "specfleet"] if i % 2 == 0 else ["specfleet", "direct"]
        for side in order:
            wait_unloaded(api, "cold")  # both start from a quiet machine: nothing loaded
            if side == "direct":
                out["direct"].append(await direct_cold_start(
                    argv, env, "cold", max_tokens, work / f"direct-{i}.log"))
                continue
            async with aiohttp.ClientSession() as s:
                out["specfleet"].append(await first_token(s, proxy, "cold", max_tokens))
            out["daemon_cold_start"].append(
                target_state(api, "cold")["on_demand"]["cold_start_s"])
    return out


def daemon_phases(events_file: Path) -> tuple[list[float], list[float]]:
    """Per load on demand after the first (the warm-up): seconds from the demand to the
    spawn, and from the spawn to ready, from the daemon's event log."""
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    spawned: float | None = None
    before, loading = [], []
    for e in events:
        if e.get("target") != "cold":
            continue
        if e["kind"] == "state" and e.get("new") == "loading":
            spawned = e["time"]
        elif e["kind"] == "load" and "waited_s" in e.get("data", {}) and spawned is not None:
            ready = e["time"]
            loading.append(ready - spawned)
            before.append(e["data"]["waited_s"] - (ready - spawned))
    return before[1:], loading[1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    def progress(msg: str) -> None:
        print(msg, file=sys.stderr)

    binary = str(provision.cached_llama_server() or provision.build_llama_server(progress=progress))
    model = str(assemble_example_model(progress=progress))
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        work = Path(tmp)
        fleet = work / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"version": 1, "daemon": {
            "state_dir": str(work / "state"), "api": f"127.0.0.1:{free_port()}",
            "proxy": {"listen": f"127.0.0.1:{free_port()}", "hold": "120s"}},
            "targets": {"cold": {
                "model": model, "binary": binary, "port": free_port(), "start": "on_demand",
                "idle_unload": "1s", "min_residency": "0s",
                "args": ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"],
                "speculation": {"method": "ngram"}}}}, sort_keys=False))
        daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet)],
                                  cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=(work / "daemon.log").open("wb"))
        try:
            deadline = time.monotonic() + 60
            while not target_state(yaml.safe_load(fleet.read_text())["daemon"]["api"], "cold"):
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError((work / "daemon.log").read_text()[-3000:])
                time.sleep(0.2)
            out = asyncio.run(measure(fleet, work, args.pairs, args.max_tokens))
        finally:
            daemon.terminate()
            daemon.wait(60)
        before_spawn, loading = daemon_phases(work / "state" / "events.jsonl")
    ratios = [s / d for s, d in zip(out["specfleet"], out["direct"], strict=True)]
    ratio = statistics.median(ratios)
    result = {"pairs": args.pairs, "max_tokens": args.max_tokens,
              "direct_s": out["direct"], "specfleet_s": out["specfleet"],
              "daemon_cold_start_s": out["daemon_cold_start"],
              "median_direct_s": statistics.median(out["direct"]),
              "median_specfleet_s": statistics.median(out["specfleet"]),
              "ratio_specfleet_over_direct": ratio,
              # From the daemon's own events, per load after the warm-up: the request's wait
              # before the runtime was spawned, and the runtime's own spawn-to-ready time.
              "daemon_before_spawn_ms": [round(1000 * b, 1) for b in before_spawn],
              "runtime_loading_s": loading,
              "median_before_spawn_over_loading": statistics.median(
                  b / ld for b, ld in zip(before_spawn, loading, strict=True)),
              "added_ms_median": 1000 * statistics.median(
                  s - d for s, d in zip(out["specfleet"], out["direct"], strict=True))}
    print(json.dumps(result, indent=1))
    print(f"\ncold start to first token: direct {result['median_direct_s']:.3f} s, through "
          f"specfleet {result['median_specfleet_s']:.3f} s; specfleet / direct {ratio:.3f} "
          f"(+{result['added_ms_median']:.0f} ms); goal < 1.10: "
          f"{'met' if ratio < 1.10 else 'MISSED'}")
    print(f"daemon's events: the request waited {statistics.median(before_spawn) * 1000:.0f} ms "
          f"(median) before the runtime was spawned, "
          f"{100 * result['median_before_spawn_over_loading']:.1f} % of the runtime's own "
          f"loading ({statistics.median(loading):.3f} s); ready is then seen within "
          "one 50 ms probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
