"""Stand-ins for `vllm` and `ollama`, at the wire boundary only.

Neither runtime can run on these machines (no CUDA; no Ollama binary in the registries).
These serve the endpoints and print the output lines that tests/fixtures/README.md describes
for them, over real HTTP, from a real process that specfleet's process launcher starts;
everything on specfleet's side is the real plugin code. Invoked through small wrapper
scripts named `vllm` and `ollama` (tests/test_vllm_ollama.py writes them).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from aiohttp import web

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _arg(argv: list[str], flag: str, default: str = "") -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def vllm(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print("0.33.0")
        return 0
    assert argv[0] == "serve", argv
    if os.environ.get("FAKE_VLLM_FAIL") == "oom":
        print("ERROR 11-30 06:00:00 [core.py:700] EngineCore failed to start.", file=sys.stderr)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
              "has a total capacity of 79.19 GiB of which 1.06 GiB is free.", file=sys.stderr)
        return 1
    print(f"INFO speculative_config={_arg(argv, '--speculative-config', 'None')}", flush=True)
    time.sleep(1.0)  # loading: connection refused, as vLLM does before it binds
    metrics = (FIXTURES / "vllm_metrics.txt").read_text()
    scrapes = {"n": 0}

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def prometheus(_: web.Request) -> web.Response:
        # Counters grow with every scrape, as under load.
        scrapes["n"] += 1
        lines = []
        for line in metrics.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if not line.startswith("#") and name.endswith(("_total", "_sum", "_count")):
                key, value = line.rsplit(" ", 1)
                line = f"{key} {float(value) * scrapes['n']}"
            lines.append(line)
        return web.Response(text="\n".join(lines) + "\n",
                            content_type="text/plain", charset="utf-8")

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("model") != _arg(argv, "--served-model-name"):
            return web.json_response({"error": {"message": "model not found"}}, status=404)
        return web.json_response({"choices": [{"text": " ok"}],
                                  "usage": {"completion_tokens": 2}})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", prometheus)
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host=_arg(argv, "--host", "127.0.0.1"), port=int(_arg(argv, "--port")),
                print=None)
    return 0


def ollama(argv: list[str]) -> int:
    host = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434")
    if argv[:1] == ["--version"]:
        print("ollama version is 0.33.0")
        return 0
    if argv[0] == "create":
        text = Path(_arg(argv, "-f")).read_text()
        req = urllib.request.Request(f"http://{host}/api/create", method="POST",
                                     data=json.dumps({"model": argv[1],
                                                      "modelfile": text}).encode())
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
        except OSError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        print("success")
        return 0
    assert argv[0] == "serve", argv
    models: dict[str, str] = {}
    loaded: set[str] = set()
    timing = (FIXTURES / "llama_server_timing.log").read_text()

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0"})

    async def create(request: web.Request) -> web.Response:
        body = await request.json()
        source = body["modelfile"].splitlines()[0].removeprefix("FROM ").strip()
        if source.startswith("/") and not Path(source).exists():
            return web.json_response({"error": f"open {source}: no such file or directory"},
                                     status=400)
        models[body["model"]] = body["modelfile"]
        return web.json_response({"status": "success"})

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        name = body["model"]
        if name not in models:
            return web.json_response({"error": f"model '{name}' not found"}, status=404)
        loaded.add(name)
        if not body.get("prompt"):
            return web.json_response({"model": name, "response": "", "done": True,
                                      "done_reason": "load"})
        print(timing, file=sys.stderr, flush=True)  # the embedded llama-server's lines
        return web.json_response({"model": name, "response": " ok", "done": True,
                                  "eval_count": 64, "eval_duration": 1490520000})

    async def ps(_: web.Request) -> web.Response:
        return web.json_response({"models": [
            {"name": f"{m}:latest", "model": f"{m}:latest", "size": 300_000_000,
             "size_vram": 0, "expires_at": "2318-08-23T00:00:00Z"} for m in sorted(loaded)]})

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_post("/api/create", create)
    app.router.add_post("/api/generate", generate)
    app.router.add_get("/api/ps", ps)
    address, _, port = host.rpartition(":")
    web.run_app(app, host=address.strip("[]"), port=int(port), print=None)
    return 0


if __name__ == "__main__":
    sys.exit({"vllm": vllm, "ollama": ollama}[sys.argv[1]](sys.argv[2:]))
