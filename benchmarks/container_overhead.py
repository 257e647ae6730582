"""What running a target in a container costs (issue 18): the same llama-server, model and
command line as two targets of one `specfleet run`, one with `launcher: process` and one
with `launcher: container` (podman with runc, an image of the cached llama-server built by
tests/container_image.py), measured alternately in one run:

  cold start    a request for the unloaded target (`start: on_demand`, `idle_unload: 1s`)
                through the proxy: seconds to its first token, load included. The
                container side adds the image lookup, the preflight inside the image
                (cached after the first), `podman rm`, `podman run -d`, `inspect`.
  generation    then 4 sequential completions of 64 tokens through the proxy: tokens/s.

    .venv/bin/python benchmarks/container_overhead.py [--pairs 8]

Each pair measures both sides, the order flipped every pair; ratios container / process
are medians of per-pair ratios. Needs podman and runc (`apt-get install podman runc`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

from benchmarks.cold_start import first_token, target_state, wait_unloaded  # noqa: E402
from benchmarks.serverproc import free_port  # noqa: E402
from plugins.llamacpp import provision  # noqa: E402
from supervisor.plugin import assemble_example_model  # noqa: E402
from tests.container_image import (  # noqa: E402
    SANDBOX,
    build_image,
    remove_containers_of,
    use_sandbox_conf,
)

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"


async def tokens_per_second(session: aiohttp.ClientSession, proxy: str, model: str,
                            requests: int, max_tokens: int) -> float:
    tokens, started = 0, time.perf_counter()
    for i in range(requests):
        body = {"model": model, "prompt": PROMPT + f"def f{i}(x):\n", "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        async with session.post(f"{proxy}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            tokens += int((await resp.json())["usage"]["completion_tokens"])
    return tokens / (time.perf_counter() - started)


async def measure(api: str, proxy: str, pairs: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {side: {"cold_s": [], "tok_s": []}
                                              for side in ("process", "container")}
    async with aiohttp.ClientSession() as s:
        for side in out:  # warm-up: page cache, the preflight caches, the run records
            await first_token(s, proxy, side, 8)
    for i in range(pairs):
        order = ["process", "container"] if i % 2 == 0 else ["container", "process"]
        for side in order:
            for name in out:
                wait_unloaded(api, name)  # nothing else loaded while this side loads
            async with aiohttp.ClientSession() as s:
                out[side]["cold_s"].append(await first_token(s, proxy, side, 8))
                out[side]["tok_s"].append(await tokens_per_second(s, proxy, side, 4, 64))
            print(f"pair {i} {side}: cold {out[side]['cold_s'][-1]:.2f} s, "
                  f"{out[side]['tok_s'][-1]:.1f} tok/s", file=sys.stderr)
    return out


def fleet_file(work: Path, binary: str, model: str, image: str) -> Path:
    common = {"model": model, "start": "on_demand", "idle_unload": "1s", "min_residency": "0s",
              "args": ["--ctx-size", "2048", "--parallel", "1", "--threads", "1"],
              "speculation": {"method": "ngram"}, "tuning": {"enabled": False}}
    fleet = work / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"version": 1, "daemon": {
        "state_dir": str(work / "state"), "api": f"127.0.0.1:{free_port()}",
        "proxy": {"listen": f"127.0.0.1:{free_port()}", "hold": "120s"}},
        "targets": {
            "process": {**common, "binary": binary, "port": free_port()},
            "container": {**common, "port": free_port(), "launcher": "container",
                          "container": {"image": image, **SANDBOX}}}}, sort_keys=False))
    return fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr)

    binary = str(provision.cached_llama_server() or provision.build_llama_server(progress=progress))
    model = str(assemble_example_model(progress=progress))
    with tempfile.TemporaryDirectory(prefix="container-overhead-") as tmp:
        work = Path(tmp)
        use_sandbox_conf(work)
        image = build_image(binary, work)
        fleet = fleet_file(work, binary, model, image)
        doc = yaml.safe_load(fleet.read_text())
        api, proxy = doc["daemon"]["api"], "http://" + doc["daemon"]["proxy"]["listen"]
        daemon = subprocess.Popen([sys.executable, "-m", "supervisor", "run", str(fleet)],
                                  cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=(work / "daemon.log").open("wb"))
        try:
            deadline = time.monotonic() + 60
            while not target_state(api, "container"):
                if time.monotonic() > deadline or daemon.poll() is not None:
                    raise RuntimeError((work / "daemon.log").read_text()[-3000:])
                time.sleep(0.2)
            out = asyncio.run(measure(api, proxy, args.pairs))
        finally:
            daemon.terminate()
            daemon.wait(60)
            left = remove_containers_of(str(work / "state"))
    ratio = {key: statistics.median(c / p for c, p in zip(
        out["container"][key], out["process"][key], strict=True)) for key in ("cold_s", "tok_s")}
    result = {"pairs": args.pairs, "image": image, "raw": out, "ratio_container_over_process":
              ratio, "containers_left": left,
              "median": {side: {k: statistics.median(v) for k, v in d.items()}
                         for side, d in out.items()}}
    results = REPO / "benchmarks" / "results" / "container_overhead.json"
    results.write_text(json.dumps(result, indent=1))
    med = result["median"]
    print(f"cold start to first token: process {med['process']['cold_s']:.2f} s, container "
          f"{med['container']['cold_s']:.2f} s; container / process {ratio['cold_s']:.3f}")
    print(f"generation through the proxy: process {med['process']['tok_s']:.1f} tok/s, "
          f"container {med['container']['tok_s']:.1f} tok/s; container / process "
          f"{ratio['tok_s']:.3f}")
    print(f"containers left after the daemon stopped: {left or 'none'}; written: {results}")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
