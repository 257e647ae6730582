"""Ollama backend: specfleet runs `ollama serve` for the target (its own OLLAMA_HOST port,
optionally its own models directory), writes a Modelfile (FROM, DRAFT, PARAMETER lines),
runs `ollama create`, and loads the model with keep_alive so that it stays loaded.

Formats of Ollama 0.33 (its source at v0.33.0-rc2: docs/ollama.md, reproduced by the
stand-in in tests/fake_runtimes.py): `DRAFT <local gguf>` in the Modelfile (never the FROM
file), run by Ollama's llama-server as an MTP draft unless it is a DFlash model,
`draft_num_predict` (changing it reloads the runner: a retune is a restart),
no acceptance counters in the API: acceptance is read from the embedded llama-server's
`draft acceptance = ...` lines in the server's output (the same lines llama-server b11434
prints, see tests/fixtures), throughput from its `eval time = ...` lines and from
`eval_count / eval_duration`. Ollama has no authentication: a non-loopback bind is
refused unless `options.proxy_guarded: true` says a proxy in front guards it. Ollama
cannot be installed here: this backend was tested against those formats only.

With `launcher: external`, specfleet starts no server: it creates and loads the model on
the Ollama server already listening at host:port (the local `ollama` client runs `ollama
create`), watches it, and re-creates and reloads the model when it goes missing. Its log
is not specfleet's, so there is no acceptance data in that mode.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from supervisor.plugin import (
    GPU_RUNTIME_OVERHEAD,
    MISSING,
    Assignment,
    Backend,
    ContextSettings,
    Estimate,
    Failure,
    FailureKind,
    Generation,
    LaunchSpec,
    MetricsSample,
    Probe,
    Problem,
    Readiness,
    SpecfleetError,
    Target,
    check_binary_found,
    check_options,
    command_binary,
    cuda_env,
    find_out_of_memory,
    hookimpl,
    llamacpp_model,
    read_model_facts,
    traits_for,
)

OPTIONS: dict[str, tuple[type, ...]] = {
    "models_dir": (str,), "modelfile_dir": (str,), "model_name": (str,),
    "keep_alive": (str, int), "num_ctx": (int,), "parameters": (dict,),
    "proxy_guarded": (bool,),
}
DEFAULT_DRAFT_NUM_PREDICT = 4  # Ollama's draft_num_predict default
LOOPBACK = ("127.0.0.1", "localhost", "::1")

# The embedded llama-server's per-request lines (server-context.cpp, b11434).
_ACCEPTANCE = re.compile(r"draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\)"
                         r", mean len =\s*([\d.]+)")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_NO_MODEL = re.compile(r"[^\n]*(?:pull model manifest: file does not exist|model .* not found|"
                       r"no such file or directory)[^\n]*", re.IGNORECASE)


class OllamaBackend(Backend):
    name = "ollama"
    description = "Ollama (ollama serve)"
    default_binary = "ollama"
    supports_external = True  # launcher: external manages the model on an existing server

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self._prepare: asyncio.Task[None] | None = None
        self._epoch = time.time()
        self._counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "tokens": 0, "ms": 0.0}
        self.size_vram: int | None = None

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = check_options(target, OPTIONS)
        launcher = traits_for(target.launcher)
        if launcher.in_image:
            # `ollama create` registers the model with the running server from this machine:
            # it would need the image's ollama, and the server's model store, on the host.
            problems.append(Problem((), f"launcher: {target.launcher} does not run Ollama; run "
                                    "the Ollama image yourself and use launcher: external"))
        if target.host not in LOOPBACK and target.options.get("proxy_guarded") is not True \
                and launcher.starts_server:
            problems.append(Problem(("host",), f"Ollama has no authentication: binding it to "
                                    f"{target.host} exposes it to the network. Keep host "
                                    "127.0.0.1, or put an authenticating proxy in front and "
                                    "set options.proxy_guarded: true"))
        if target.api_key is not None:
            problems.append(Problem(("api_key",), "Ollama has no API-key authentication "
                                    "(OLLAMA_API_KEY is a cloud client credential); remove "
                                    "api_key and guard it with a proxy"))
        if target.speculation.method not in ("none", "draft"):
            problems.append(Problem(("speculation", "method"), "Ollama drafts only with a draft "
                                    "model (method: draft, a DRAFT line in the Modelfile)"))
        if Path(target.model).expanduser().suffix == ".gguf" or target.model.startswith(
                ("/", ".", "~")):
            if not Path(target.model).expanduser().is_file():
                problems.append(Problem(("model",), f"model file {target.model!r} does not "
                                        "exist", MISSING))
        else:
            problems.append(Problem(("model",), f"{target.model!r} is an Ollama model name; "
                                    "whether it exists cannot be checked offline", "warning"))
        draft = target.speculation.draft
        if draft and not Path(draft).expanduser().is_file():
            problems.append(Problem(("speculation", "draft"), f"draft file {draft!r} does not "
                                    "exist (DRAFT takes a local GGUF file)", MISSING))
        elif draft:
            problems += _draft_problems(target.model, draft)
        return problems + check_binary_found(cls, target)

    # --- naming and files ---

    @property
    def model_name(self) -> str:
        return str(self.target.options.get("model_name", f"specfleet-{self.target.name}"))

    def openai_model(self) -> str:
        return self.model_name

    @property
    def keep_alive(self) -> str | int:
        return self.target.options.get("keep_alive", -1)

    def modelfile_path(self) -> Path:
        base = self.target.options.get("modelfile_dir", "~/.cache/specfleet/ollama")
        return Path(str(base)).expanduser() / f"{self.target.name}.Modelfile"

    def modelfile(self, draft_length: int | None, speculation: bool) -> str:
        t = self.target
        model = str(Path(t.model).expanduser()) if t.model.startswith(("/", ".", "~")) else t.model
        lines = [f"FROM {model}"]
        if speculation and t.speculation.method == "draft" and t.speculation.draft:
            lines.append(f"DRAFT {Path(t.speculation.draft).expanduser()}")
            n = draft_length if draft_length is not None else t.speculation.length.start
            if n is not None:
                lines.append(f"PARAMETER draft_num_predict {n}")
        if "num_ctx" in t.options:
            lines.append(f"PARAMETER num_ctx {t.options['num_ctx']}")
        for key, value in sorted((t.options.get("parameters") or {}).items()):
            lines.append(f"PARAMETER {key} {value}")
        return "\n".join(lines) + "\n"

    def describe_launch(self, spec: LaunchSpec) -> list[str]:
        lines = super().describe_launch(spec)
        draft = self.target.speculation.draft
        if self.target.speculation.method == "draft" and draft and Path(draft).expanduser().is_file():
            start = self.target.speculation.length.start  # 0 is a value: no drafting
            n = DEFAULT_DRAFT_NUM_PREDICT if start is None else start
            args = runner_draft_args(_architecture(draft), n, str(Path(draft).expanduser()))
            lines.append("Ollama then runs its llama-server with " + " ".join(args) if args
                         else "Ollama then runs its llama-server without a draft "
                              "(draft_num_predict 0)")
        return lines

    def tunable_length(self) -> str | None:
        return "draft_num_predict (Modelfile)" if self.target.speculation.method == "draft" \
            else None

    def default_length(self) -> int | None:
        return DEFAULT_DRAFT_NUM_PREDICT if self.target.speculation.method == "draft" else None

    def length_ceiling(self) -> int:
        return 16

    def model_files(self) -> dict[str, str]:
        return {role: path for role, path in super().model_files().items()
                if Path(path).is_file()}

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Assignment | None = None) -> LaunchSpec:
        t = self.target
        host = f"[{t.host}]" if ":" in t.host else t.host
        env = dict(t.env)
        env["OLLAMA_HOST"] = f"{host}:{t.port}"
        env["OLLAMA_KEEP_ALIVE"] = str(self.keep_alive)
        if "models_dir" in t.options:
            env["OLLAMA_MODELS"] = str(Path(str(t.options["models_dir"])).expanduser())
        env.update(cuda_env(self.target, placement))
        # A new server process: its counters start from zero, and the model is created and
        # loaded again once it answers.
        self._epoch, self._prepare, self.size_vram = time.time(), None, None
        self._counts = dict.fromkeys(self._counts, 0)
        self._counts["ms"] = 0.0
        files = {str(self.modelfile_path()): self.modelfile(draft_length, speculation)}
        if not self.launcher_traits.starts_server:
            # The server is not ours: only the Modelfile is written; `ollama create` and the
            # load go to the server at host:port.
            return LaunchSpec((f"(the Ollama server at {t.base_url})",), {}, files=files)
        return LaunchSpec((command_binary(self), "serve"), env, files=files)

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        files = self.model_files()
        if "model" not in files:
            return None
        settings = ContextSettings(ctx=self.target.options.get("num_ctx", 4096), parallel=1)
        estimate = llamacpp_model(read_model_facts(files["model"]), settings, "target")
        if "draft" in files:
            estimate += llamacpp_model(read_model_facts(files["draft"]), settings, "draft")
        return estimate + Estimate(overhead=GPU_RUNTIME_OVERHEAD if on_gpu else 0)

    # --- readiness: server up, then the model created and loaded ---

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        async with http.get(f"{self.base_url}/api/version") as resp:
            if resp.status != 200:
                return Probe(Readiness.UNHEALTHY, f"/api/version answered HTTP {resp.status}")
        if self._prepare is None:
            self._prepare = asyncio.create_task(self._create_and_load(http),
                                                name=f"ollama-load:{self.target.name}")
        if not self._prepare.done():
            return Probe(Readiness.LOADING, "creating and loading the model")
        if (exc := self._prepare.exception()) is not None:
            return Probe(Readiness.UNHEALTHY, str(exc))
        async with http.get(f"{self.base_url}/api/ps") as resp:
            models = (await resp.json()).get("models", []) if resp.status == 200 else []
        loaded = next((m for m in models if m.get("name", "").split(":")[0] == self.model_name
                       or m.get("model", "").split(":")[0] == self.model_name), None)
        if loaded is None:
            return Probe(Readiness.UNHEALTHY, f"model {self.model_name} is not loaded "
                         "(evicted? keep_alive is " f"{self.keep_alive})")
        self.size_vram = int(loaded.get("size_vram", 0))
        return Probe(Readiness.READY)

    async def _create_and_load(self, http: aiohttp.ClientSession) -> None:
        t = self.target
        host = f"[{t.host}]" if ":" in t.host else t.host
        proc = await asyncio.create_subprocess_exec(
            self.resolve_binary(), "create", self.model_name, "-f", str(self.modelfile_path()),
            env={**os.environ, **t.env, "OLLAMA_HOST": f"{host}:{t.port}"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise SpecfleetError(f"ollama create {self.model_name} failed: "
                                 f"{out.decode(errors='replace').strip()[-500:]}")
        body = {"model": self.model_name, "keep_alive": self.keep_alive}
        async with http.post(f"{t.base_url}/api/generate", json=body,
                             timeout=aiohttp.ClientTimeout(total=None)) as resp:
            if resp.status != 200:
                raise SpecfleetError(f"loading {self.model_name} failed: HTTP {resp.status}: "
                                     f"{(await resp.text())[:300]}")

    # --- metrics from the server's output ---

    def on_output(self, line: str) -> None:
        if m := _ACCEPTANCE.search(line):
            accepted, generated, mean_len = int(m.group(2)), int(m.group(3)), float(m.group(4))
            self._counts["accepted"] += accepted
            self._counts["draft_tokens"] += generated
            # mean len = 1 + accepted / verification steps (server-context.cpp).
            if mean_len > 1:
                self._counts["drafts"] += round(accepted / (mean_len - 1))
        elif m := _EVAL.search(line):
            self._counts["ms"] += float(m.group(1))
            self._counts["tokens"] += int(m.group(2))

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        c = self._counts
        return MetricsSample(process_start=self._epoch, drafts=int(c["drafts"]),
                             draft_tokens=int(c["draft_tokens"]), accepted_tokens=int(c["accepted"]),
                             tokens_predicted=int(c["tokens"]),
                             tokens_predicted_seconds=c["ms"] / 1000.0)

    async def generate(self, http: aiohttp.ClientSession, prompt: str, max_tokens: int,
                       sampling: Mapping[str, object]) -> Generation:
        body: dict[str, Any] = {"model": self.model_name, "prompt": prompt, "stream": False,
                                "options": {"num_predict": max_tokens, **sampling}}
        async with http.post(f"{self.base_url}/api/generate", json=body) as resp:
            resp.raise_for_status()
            data = await resp.json()
        return Generation(data.get("response", ""), int(data.get("eval_count", 0)),
                          int(data.get("eval_duration", 0)) / 1e9)

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        if message := find_out_of_memory(output_tail):
            return Failure(FailureKind.OUT_OF_MEMORY, f"out of memory: {message}")
        if "address already in use" in output_tail:
            return Failure(FailureKind.PORT_IN_USE, f"ollama serve could not bind "
                           f"{self.target.host}:{self.target.port}: address already in use")
        if m := _NO_MODEL.search(output_tail):
            return Failure(FailureKind.LOAD_ERROR, f"Ollama cannot find the model: "
                           f"{m.group(0).strip()}", False)
        return None


def runner_draft_args(architecture: str, n: int, path: str) -> list[str]:
    """The flags Ollama gives its llama-server for a DRAFT model (v0.33.0-rc2,
    llm/llama_server.go `appendDraftArgs`, the type from `externalDraftType`): draft-dflash
    for a draft whose GGUF architecture is dflash, draft-mtp (with backend sampling) for
    any other; `draft_num_predict` as --spec-draft-n-max, none of it when it is 0."""
    if n <= 0:
        return []
    kind = "draft-dflash" if architecture == "dflash" else "draft-mtp"
    return ["--spec-type", kind, "--spec-draft-n-max", str(n),
            *(["--spec-draft-backend-sampling"] if kind == "draft-mtp" else []),
            "--spec-draft-model", path]


def _architecture(path: str) -> str:
    try:
        return read_model_facts(str(Path(path).expanduser())).architecture
    except (OSError, SpecfleetError, ValueError):
        return "unknown"


def _draft_problems(model: str, draft: str) -> list[Problem]:
    """What Ollama does with this DRAFT, as its source says (v0.33.0-rc2)."""
    where = ("speculation", "draft")
    model_path = Path(model).expanduser()
    if model_path.exists() and model_path.resolve() == Path(draft).expanduser().resolve():
        return [Problem(where, "Ollama refuses a DRAFT that is the FROM file (parser/parser.go "
                        "rejectMatchingLocalPath: \"DRAFT must not reference the same local "
                        "path as FROM\", symlinks resolved); draft with another file")]
    arch = _architecture(draft)
    if arch == "dflash":
        return []
    return [Problem(where, f"Ollama runs a DRAFT whose architecture is not dflash ({arch}) "
                    "as an MTP head: --spec-type draft-mtp (llm/llama_server.go "
                    "externalDraftType), not llama.cpp's draft-model speculation "
                    "(--spec-type draft-simple, what backend: llamacpp runs for method draft); "
                    "a plain small model is not an MTP head", "warning")]


@hookimpl
def register_backends(register) -> None:  # type: ignore[no-untyped-def]
    register(OllamaBackend)
