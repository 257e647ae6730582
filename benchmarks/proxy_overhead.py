"""What specfleet's OpenAI-compatible proxy costs: streamed tokens/s and time to first token
through the proxy against the same llama-server directly, measured in one run.

    .venv/bin/python benchmarks/proxy_overhead.py [--pairs 100] [--max-tokens 48]

Two targets run by `specfleet run` with the proxy on: the real llama-server (gemma-3-270m
Q4_K_M, CPU, one thread) and an "instant" server that answers a streamed chat at once
(a stand-in, so that the proxy's own latency is not buried in the model's: llama-server's
time to first token varies by +-10 ms from request to request on these machines).
Requests alternate direct / proxy (ABAB...), one at a time, so drift of the machine hits
both sides alike; overheads are medians of per-pair differences. Goal (issue 7):
throughput >= 0.99x direct, and < 1 ms added to the time to first token at the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."

# A server with llama-server's command line, /health and a streamed chat that answers at
# once: it isolates the proxy's own latency. (--help/--version for specfleet's preflight.)
INSTANT = """\
import sys
if "--help" in sys.argv: print("--spec-type"); sys.exit(0)
if "--version" in sys.argv: print("version: 0 (instant stand-in)"); sys.exit(0)
from aiohttp import web
async def health(_): return web.json_response({"status": "ok"})
async def metrics(_): return web.Response(text="")
async def chat(request):
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for word in ("one", " two", " three"):
        await resp.write(('data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\\n\\n'
                          % word).encode())
    await resp.write(b"data: [DONE]\\n\\n")
    await resp.write_eof()
    return resp
app = web.Application()
app.router.add_get("/health", health)
app.router.add_get("/metrics", metrics)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]),
            print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stream_once(session: aiohttp.ClientSession, base: str, model: str,
                      max_tokens: int) -> tuple[float, float, int]:
    """(time to first token, tokens/s after the first, tokens) of one streamed chat."""
    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": PROMPT}]}
    started = time.perf_counter()
    first = last = None
    tokens = 0
    async with session.post(f"{base}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if choices and choices[0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += 1
    assert first is not None and last is not None and tokens > 1
    return first - started, (tokens - 1) / (last - first), tokens


async def measure(direct: str, proxy: str, model: str, pairs: int,
                  max_tokens: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"ttft_direct": [], "ttft_proxy": [], "tps_direct": [],
                                   "tps_proxy": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(3):  # warm-up, not counted
            await stream_once(s, direct, model, max_tokens)
            await stream_once(s, proxy, model, max_tokens)
        for i in range(pairs):
            order = [("direct", direct), ("proxy", proxy)]
            if i % 2:
                order.reverse()
            for side, base in order:
                ttft, tps, _ = await stream_once(s, base, model, max_tokens)
                out[f"ttft_{side}"].append(ttft)
                out[f"tps_{side}"].append(tps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" /
                                             "proxy_overhead.json"))
    args = parser.parse_args()
    binary = provision.cached_llama_server() or provision.build_llama_server()
    model = assemble_example_model(lambda msg: print(msg, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="specfleet-proxy-bench-"))
    port, instant_port, proxy_port = free_port(), free_port(), free_port()
    instant = work / "instant-server"
    instant.write_text(f"#!{sys.executable}\n" + INSTANT)
    instant.chmod(0o755)
    fleet = work / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({
        "version": 1,
        "daemon": {"state_dir": str(work / "state"), "api": f"127.0.0.1:{free_port()}",
                   "proxy": {"listen": f"127.0.0.1:{proxy_port}"}},
        "targets": {"instant": {"model": str(model), "binary": str(instant),
                                "port": instant_port, "tuning": {"enabled": False}},
                    "bench": {"model": str(model), "binary": str(binary), "port": port,
                              # One generation thread: on a 2-core machine the other core is
                              # left to the client and specfleet, as a GPU host's CPU is.
                              "args": ["--ctx-size", "2048", "--parallel", "1",
                                       "--threads", "1"],
                              "tuning": {"enabled": False}}}}))
    daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status = json.loads((work / "state" / "status.json").read_text())
                if [t["state"] for t in status["targets"]] == ["ready", "ready"]:
                    break
            except (OSError, ValueError, IndexError, KeyError):
                pass
            time.sleep(0.2)
        else:
            raise SystemExit("the target did not become ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
            pass
        print(f"measuring {args.pairs} pairs of streamed chats ({args.max_tokens} tokens), "
              "direct vs through the proxy...", file=sys.stderr)
        data = asyncio.run(measure(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy_port}",
                                   "bench", args.pairs, args.max_tokens))
        alone = asyncio.run(measure(f"http://127.0.0.1:{instant_port}",
                                    f"http://127.0.0.1:{proxy_port}", "instant",
                                    4 * args.pairs, 3))
    finally:
        daemon.terminate()
        daemon.wait(60)

    added_ms = [1000 * (p - d) for p, d in zip(data["ttft_proxy"], data["ttft_direct"],
                                               strict=True)]
    tps_ratio = statistics.median(data["tps_proxy"]) / statistics.median(data["tps_direct"])
    paired_tps = statistics.median(p / d for p, d in zip(data["tps_proxy"], data["tps_direct"],
                                                         strict=True))
    median_added = statistics.median(added_ms)
    alone_ms = [1000 * (p - d) for p, d in zip(alone["ttft_proxy"], alone["ttft_direct"],
                                               strict=True)]
    own_added = statistics.median(alone_ms)
    report = {
        "pairs": args.pairs, "max_tokens": args.max_tokens,
        "tps_ratio_of_medians": round(tps_ratio, 4), "tps_ratio_paired_median": round(paired_tps, 4),
        "ttft_added_ms_median": round(median_added, 3),
        "ttft_added_ms_p10_p90": [round(x, 3) for x in statistics.quantiles(added_ms, n=10)[::8]],
        "ttft_direct_ms_median": round(1000 * statistics.median(data["ttft_direct"]), 2),
        "proxy_own_ttft_added_ms_median": round(own_added, 3),
        "proxy_own_ttft_added_ms_p10_p90": [round(x, 3) for x in
                                            statistics.quantiles(alone_ms, n=10)[::8]],
        "instant_ttft_direct_ms_median": round(1000 * statistics.median(alone["ttft_direct"]), 3),
        "raw": data, "raw_instant": alone,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"streamed tokens/s, proxy / direct: {tps_ratio:.4f} (ratio of medians), "
          f"{paired_tps:.4f} (median of pairs)  (goal >= 0.99: "
          f"{'met' if min(tps_ratio, paired_tps) >= 0.99 else 'missed'})")
    print(f"time to first token added by the proxy: median {median_added:.3f} ms "
          f"(p10..p90 {report['ttft_added_ms_p10_p90'][0]:.3f}..{report['ttft_added_ms_p10_p90'][1]:.3f}"
          f" ms; direct TTFT median {report['ttft_direct_ms_median']} ms): llama-server's own "
          "variation dominates this number")
    print(f"the proxy's own latency (instant upstream, {4 * args.pairs} pairs): median "
          f"{own_added:.3f} ms added (p10..p90 {report['proxy_own_ttft_added_ms_p10_p90'][0]:.3f}"
          f"..{report['proxy_own_ttft_added_ms_p10_p90'][1]:.3f} ms; direct "
          f"{report['instant_ttft_direct_ms_median']} ms)  (goal < 1 ms: "
          f"{'met' if own_added < 1.0 else 'missed'})")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
