"""Stand-ins for `vllm` and `ollama`, at the wire boundary only.

Neither runtime can run on these machines (no CUDA; no Ollama binary in the registries).
These serve the endpoints and print the output lines that tests/fixtures/README.md describes
for them, over real HTTP, from a real process that specfleet's process launcher starts;
everything on specfleet's side is the real plugin code. Invoked through small wrapper
scripts named `vllm` and `ollama` (tests/backends/test_vllm_ollama.py writes them).
"""

from __future__ import annotations

import hashlib
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


def _modelfile_request(path: Path) -> dict[str, object]:
    """What `ollama create -f` sends (v0.33.0-rc2, parser/parser.go `CreateRequest`): local
    FROM and DRAFT files as name -> digest maps (`files`, `draft_files`), PARAMETER lines as
    typed `parameters`; a DRAFT that is the FROM file (symlinks resolved) is refused."""
    files: dict[str, str] = {}
    drafts: dict[str, str] = {}
    params: dict[str, object] = {}
    request: dict[str, object] = {}
    paths: dict[str, list[Path]] = {"from": [], "draft": []}
    blobs: dict[str, str] = {}  # digest -> local path: uploaded before the request
    for line in path.read_text().splitlines():
        command, _, args = line.partition(" ")
        command = command.lower()
        if command in ("from", "draft"):
            local = Path(args).expanduser()
            if not local.exists():
                request["from"] = args  # a model name, pulled by the server
                continue
            other = paths["draft" if command == "from" else "from"]
            if any(local.resolve() == o.resolve() for o in other):
                raise SystemExit(f"Error: DRAFT must not reference the same local path as "
                                 f"FROM: {local}")
            paths[command].append(local)
            digest = "sha256:" + hashlib.sha256(local.read_bytes()).hexdigest()
            (files if command == "from" else drafts)[local.name] = digest
            blobs[digest] = str(local)
        elif command == "parameter":
            key, _, value = args.partition(" ")
            params[key] = int(value) if value.lstrip("-").isdigit() else value
    return {**request, "files": files, "draft_files": drafts, "parameters": params,
            "blobs": blobs}


def _architecture(path: str) -> str:
    import gguf

    field = gguf.GGUFReader(path).fields.get("general.architecture")
    return bytes(field.parts[field.data[0]]).decode() if field else "unknown"


def ollama(argv: list[str]) -> int:
    host = os.environ.get("OLLAMA_HOST", "127.0.0.1:11434")
    if argv[:1] == ["--version"]:
        print("ollama version is 0.33.0")
        return 0
    if argv[0] == "create":
        request = _modelfile_request(Path(_arg(argv, "-f")))
        local = request.pop("blobs")
        try:
            for digest, path in local.items():  # cmd/cmd.go createBlob: POST /api/blobs/<d>
                blob = urllib.request.Request(f"http://{host}/api/blobs/{digest}", method="POST",
                                              data=Path(path).read_bytes())
                urllib.request.urlopen(blob, timeout=30).close()
            req = urllib.request.Request(f"http://{host}/api/create", method="POST",
                                         data=json.dumps({"model": argv[1], **request}).encode())
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
        except OSError as exc:
            print(f"Error: {exc}", file=sys.stderr)
            return 1
        print("success")
        return 0
    assert argv[0] == "serve", argv
    blobs: dict[str, Path] = {}
    models: dict[str, dict[str, object]] = {}
    loaded: set[str] = set()
    timing = (FIXTURES / "llama_server_timing.log").read_text()
    store = Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models") / "blobs"

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.33.0"})

    async def blob(request: web.Request) -> web.Response:
        digest, data = request.match_info["digest"], await request.read()
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            return web.json_response({"error": "digest mismatch"}, status=400)
        store.mkdir(parents=True, exist_ok=True)
        blobs[digest] = store / digest.replace(":", "-")
        blobs[digest].write_bytes(data)
        return web.Response(status=201)

    async def create(request: web.Request) -> web.Response:
        body = await request.json()
        layers = {}
        for kind, files in (("model", body.get("files") or {}), ("draft", body.get("draft_files")
                                                                  or {})):
            for name, digest in files.items():
                if digest not in blobs:
                    return web.json_response({"error": f"missing blob {digest} ({name})"},
                                             status=400)
                layers[kind] = {"mediaType": f"application/vnd.ollama.image.{kind}",
                                "path": str(blobs[digest])}
        if "model" not in layers:
            return web.json_response({"error": "neither 'from' or 'files' was specified"},
                                     status=400)
        models[body["model"]] = {"layers": layers, "parameters": body.get("parameters") or {}}
        return web.json_response({"status": "success"})

    def runner_line(name: str) -> str:
        """server/sched.go loads the model: llm/llama_server.go startLlamaServer logs its
        command line (slog's text format), with appendDraftArgs' flags."""
        model = models[name]
        layers, params = model["layers"], model["parameters"]
        argv = ["/usr/lib/ollama/llama-server", "--model", layers["model"]["path"], "--port",
                "41235", "--host", "127.0.0.1", "--no-webui", "--offline", "-c", "4096",
                "-np", "1"]
        if "draft" in layers:
            n = int(params.get("draft_num_predict", 4))
            kind = ("draft-dflash" if _architecture(layers["draft"]["path"]) == "dflash"
                    else "draft-mtp")
            if n > 0:
                argv += ["--spec-type", kind, "--spec-draft-n-max", str(n)]
                argv += ["--spec-draft-backend-sampling"] if kind == "draft-mtp" else []
                argv += ["--spec-draft-model", layers["draft"]["path"]]
        return (f'time=2026-12-04T05:00:00.000Z level=INFO source=llama_server.go:404 '
                f'msg="starting llama-server" cmd="{" ".join(argv)}"')

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        name = body["model"]
        if name not in models:
            return web.json_response({"error": f"model '{name}' not found"}, status=404)
        if name not in loaded:
            print(runner_line(name), file=sys.stderr, flush=True)
        loaded.add(name)
        if not body.get("prompt"):
            return web.json_response({"model": name, "response": "", "done": True,
                                      "done_reason": "load"})
        print(timing, file=sys.stderr, flush=True)  # the embedded llama-server's lines
        return web.json_response({"model": name, "response": " ok", "done": True,
                                  "eval_count": 64, "eval_duration": 1490520000})

    async def ps(_: web.Request) -> web.Response:
        # api/types.go ProcessModelResponse: no draft fields.
        return web.json_response({"models": [
            {"name": f"{m}:latest", "model": f"{m}:latest", "size": 300_000_000,
             "digest": "0" * 64, "size_vram": 0, "context_length": 4096,
             "expires_at": "2318-08-23T00:00:00Z"} for m in sorted(loaded)]})

    app = web.Application(client_max_size=2 << 30)
    app.router.add_get("/api/version", version)
    app.router.add_post("/api/blobs/{digest}", blob)
    app.router.add_post("/api/create", create)
    app.router.add_post("/api/generate", generate)
    app.router.add_get("/api/ps", ps)
    address, _, port = host.rpartition(":")
    web.run_app(app, host=address.strip("[]"), port=int(port), print=None)
    return 0


if __name__ == "__main__":
    sys.exit({"vllm": vllm, "ollama": ollama}[sys.argv[1]](sys.argv[2:]))
